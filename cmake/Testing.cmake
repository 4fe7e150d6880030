# conveyor_add_test(NAME SOURCES ... [LIBS ...] [LABELS ...]): one GoogleTest binary,
# registered with CTest test by test.
function(conveyor_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main
                        conveyor_options)
  target_compile_definitions(${name} PRIVATE
    CONVEYOR_TESTDATA_DIR="${CONVEYOR_TESTDATA_DIR}"
    CONVEYOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
endfunction()
