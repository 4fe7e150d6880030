# Compiler warnings and sanitizers, applied to every conveyor target through conveyor_options.
add_library(conveyor_options INTERFACE)
target_compile_options(conveyor_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wnon-virtual-dtor>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>)
if(CONVEYOR_WERROR)
  target_compile_options(conveyor_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(CONVEYOR_SANITIZE)
  target_compile_options(conveyor_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${CONVEYOR_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(conveyor_options INTERFACE -fsanitize=${CONVEYOR_SANITIZE})
endif()
