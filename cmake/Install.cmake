# What `cmake --install build --prefix P` lays out, the CMake package consumers find, and the
# Debian packages CPack makes (`cpack -G DEB` in the build directory: conveyor and
# conveyor-dev).
#
#   P/bin/conveyord, P/bin/conveyor                        component runtime
#   P/lib/libconveyor_client.so.V                          runtime
#   P/share/conveyor/examples/                             runtime (conveyord's default config)
#   P/lib/systemd/system/conveyord.service, /etc/conveyor  runtime (the .deb only)
#   P/share/doc/conveyor/                                  runtime
#   P/include/conveyor/...                                 dev: the client header and what it includes
#   P/lib/libconveyor_client.so, P/lib/cmake/conveyor/     dev: find_package(conveyor) -> conveyor::client
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CONVEYOR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/conveyor)

install(TARGETS conveyord conveyor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS conveyor_client_shared EXPORT conveyorTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/examples
        COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/NOTICE DESTINATION ${CMAKE_INSTALL_DOCDIR}
        COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

# The client's public header and exactly what it includes: the batch description and the
# generated protocol. Nothing of the readers or the daemon (a consumer build would fail).
install(FILES ${PROJECT_SOURCE_DIR}/client/cpp/conveyor_client.h ${PROJECT_SOURCE_DIR}/client/cpp/idle_watchdog.h
              ${PROJECT_SOURCE_DIR}/client/cpp/shared_segment.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/client/cpp COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/proto/stream_reader.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/proto COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/common/batch/batch_plan.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/common/batch COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/common/config/stream_types.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/common/config COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/proto/gen/conveyor/v1/conveyor.pb.h ${PROJECT_BINARY_DIR}/proto/gen/conveyor/v1/conveyor.grpc.pb.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/conveyor/v1 COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/proto/conveyor/v1/conveyor.proto
        DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/proto/conveyor/v1 COMPONENT dev)
install(EXPORT conveyorTargets NAMESPACE conveyor:: DESTINATION ${CONVEYOR_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/conveyorConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/conveyorConfig.cmake INSTALL_DESTINATION ${CONVEYOR_CMAKE_DIR})
# 0.x: minor versions may change the ABI.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/conveyorConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/conveyorConfig.cmake ${PROJECT_BINARY_DIR}/conveyorConfigVersion.cmake
        DESTINATION ${CONVEYOR_CMAKE_DIR} COMPONENT dev)

# The system's places, for a package installed under /usr (component "system", installed by
# the .deb, not by a plain `cmake --install`): the systemd unit pointing at the installed
# daemon, and a starting configuration (loopback only, the bundled examples). The prefix is
# the one installed to (CPack's /usr), known only at install time.
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/conveyord.service\" unit)
  string(REPLACE \"/usr/local/bin/\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/\" unit \"\${unit}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/deploy/conveyord.service\" \"\${unit}\")
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/conveyor.yaml\" etc)
  string(REPLACE \"/usr/local/share/\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}/\" etc \"\${etc}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/deploy/conveyor.yaml\" \"\${etc}\")
  " COMPONENT system EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_BINARY_DIR}/deploy/conveyord.service DESTINATION lib/systemd/system COMPONENT system EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_BINARY_DIR}/deploy/conveyor.yaml DESTINATION /etc/conveyor COMPONENT system EXCLUDE_FROM_ALL)

# Debian packages: conveyor (daemon, CLI, client library, unit, example config) and
# conveyor-dev (headers, CMake package). Dependencies come from dpkg-shlibdeps.
set(CPACK_PACKAGE_NAME conveyor)
set(CPACK_PACKAGE_VENDOR "the conveyor authors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "GPU-accelerated data loader for training (CNTK, HTK, Kaldi formats) over gRPC")
set(CPACK_PACKAGE_CONTACT "conveyor authors <conveyor@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime system dev)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENT_SYSTEM_GROUP runtime)
set(CPACK_COMPONENT_RUNTIME_GROUP runtime)
set(CPACK_COMPONENT_DEV_GROUP dev)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME conveyor)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME conveyor-dev)
set(CPACK_DEBIAN_RUNTIME_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_DEV_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION science)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "conveyor (= ${PROJECT_VERSION}), libgrpc++-dev, libprotobuf-dev, libabsl-dev")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/conveyor/conveyor")
include(CPack)
