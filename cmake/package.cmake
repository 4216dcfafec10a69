# Install rules and the exported package: after `cmake --install build --prefix P`,
#   find_package(seqpar 0.1 REQUIRED)   # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE seqpar::nn seqpar::optim)
# works, and so does find_package with seqpar_DIR pointing at a build folder.
# tests/package/ is such a consumer; ctest's package_consumer builds it.
include(CMakePackageConfigHelpers)

set(SEQPAR_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/seqpar)

# Headers keep their layout under include/seqpar, as the targets' include path says.
install(DIRECTORY core autograd nn optim dist
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/seqpar
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(FILES ${PROJECT_BINARY_DIR}/generated/core/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/seqpar/core)

install(EXPORT seqparTargets NAMESPACE seqpar:: DESTINATION ${SEQPAR_INSTALL_CMAKEDIR})
export(EXPORT seqparTargets NAMESPACE seqpar:: FILE ${PROJECT_BINARY_DIR}/seqparTargets.cmake)

# The same config file serves the install and the build tree: both sit beside their
# seqparTargets.cmake.
configure_file(cmake/seqparConfig.cmake.in ${PROJECT_BINARY_DIR}/seqparConfig.cmake @ONLY)
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/seqparConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/seqparConfig.cmake ${PROJECT_BINARY_DIR}/seqparConfigVersion.cmake
  DESTINATION ${SEQPAR_INSTALL_CMAKEDIR})

if(SEQPAR_BUILD_APPS)
  install(TARGETS seqpar-repro RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
