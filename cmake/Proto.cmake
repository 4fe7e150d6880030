# gRPC and protobuf from Debian: gRPC's CMake package, CMake's FindProtobuf, the plugins.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(CONVEYOR_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_program(CONVEYOR_GRPC_PYTHON_PLUGIN grpc_python_plugin)
if(NOT TARGET protobuf::libprotobuf)
  add_library(protobuf::libprotobuf INTERFACE IMPORTED)
  set_target_properties(protobuf::libprotobuf PROPERTIES INTERFACE_LINK_LIBRARIES "${Protobuf_LIBRARIES}")
endif()
