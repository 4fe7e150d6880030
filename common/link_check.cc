// link_check.cc: the (empty) body of each layer's link check (CMakeLists.txt): the layer's
// objects, whole, linked into a shared library with only the layers below it.
