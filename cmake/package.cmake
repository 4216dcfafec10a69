# Install rules and the exported package: after `cmake --install build --prefix P`,
#   find_package(seqpar 0.1 REQUIRED)   # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE seqpar::nn seqpar::optim)
# works, and so does find_package with seqpar_DIR pointing at a build folder; without
# CMake, pkg-config's seqpar.pc (cmake/pkg_config.cmake) says the same. A program on the
# CPU alone links seqpar::cpu_nn ... (the CPU package, top-level CMakeLists.txt) or
# seqpar-cpu.pc, and so no CUDA library and no NCCL.
# examples/ is such a consumer; ctest's package_consumer (tests/package/check.sh) builds
# it each way.
include(CMakePackageConfigHelpers)

set(SEQPAR_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/seqpar)

# Headers keep their layout under include/seqpar (cmake/headers.cmake). Every header of
# the layers is installed, except where it needs what this build lacks: the .cuh device
# code and the headers that include the CUDA toolkit's own are installed only with CUDA,
# NCCL's only with NCCL.
set(seqpar_cuda_only_headers core/cuda_check.h core/curand_check.h nn/cuda/int8_gemm.h)
set(seqpar_nccl_only_headers dist/nccl_check.h dist/nccl_process_group.h)
set(seqpar_header_exclusions "")
if(NOT SEQPAR_WITH_CUDA)
  list(APPEND seqpar_header_exclusions PATTERN "*.cuh" EXCLUDE)
  foreach(header IN LISTS seqpar_cuda_only_headers)
    list(APPEND seqpar_header_exclusions REGEX "/${header}$" EXCLUDE)
  endforeach()
endif()
if(NOT SEQPAR_WITH_NCCL)
  foreach(header IN LISTS seqpar_nccl_only_headers)
    list(APPEND seqpar_header_exclusions REGEX "/${header}$" EXCLUDE)
  endforeach()
endif()
install(DIRECTORY ${SEQPAR_PUBLIC_LAYERS}
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/seqpar
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh" ${seqpar_header_exclusions})
install(FILES ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/config.h
              ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/version.h
              include/seqpar/seqpar.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/seqpar)

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

include(cmake/pkg_config.cmake)  # seqpar.pc, for builds without CMake

if(SEQPAR_BUILD_APPS)
  install(TARGETS seqpar-repro RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
