# Finds the system packages seqpar builds on; nothing is vendored.
#   Debian/Ubuntu: scripts/install-deps.sh installs them with apt.
#   CUDA toolkit: only for the CUDA backend (cudart, cuRAND's device generator, NCCL,
#   NVTX). A CPU-only build needs none of it; where cuRAND is installed anyway, a test
#   compares the Generator with cuRAND's host generator bit for bit.

find_package(Eigen3 3.3 REQUIRED NO_MODULE)
if(SEQPAR_BUILD_APPS)  # the configs of seqpar-repro; JSON for the bench programs too
  # toml++ is used header-only (TOML_HEADER_ONLY=1) even where Debian ships its shared
  # library: the programs then run on machines that have only the CUDA runtime (the GPU
  # machine has no libtomlplusplus.so).
  find_path(TOMLPLUSPLUS_INCLUDE_DIR toml++/toml.h)
  if(NOT TOMLPLUSPLUS_INCLUDE_DIR)
    message(FATAL_ERROR "toml++ headers (toml++/toml.h) not found: apt install libtomlplusplus-dev")
  endif()
  add_library(seqpar_toml INTERFACE)
  add_library(seqpar::toml ALIAS seqpar_toml)
  target_include_directories(seqpar_toml SYSTEM INTERFACE ${TOMLPLUSPLUS_INCLUDE_DIR})
  target_compile_definitions(seqpar_toml INTERFACE TOML_HEADER_ONLY=1 TOML_EXCEPTIONS=1)
  # The user's own configs: YAML (the bug report's config.yaml) through yaml-cpp, linked
  # statically where Debian ships the archive, for the same reason as toml++ above; and
  # DeepSpeed's JSON through nlohmann-json (header-only).
  find_path(YAMLCPP_INCLUDE_DIR yaml-cpp/yaml.h)
  find_library(YAMLCPP_LIBRARY NAMES libyaml-cpp.a yaml-cpp)
  if(NOT YAMLCPP_INCLUDE_DIR OR NOT YAMLCPP_LIBRARY)
    message(FATAL_ERROR "yaml-cpp not found: apt install libyaml-cpp-dev")
  endif()
  add_library(seqpar_yaml INTERFACE)
  add_library(seqpar::yaml ALIAS seqpar_yaml)
  target_include_directories(seqpar_yaml SYSTEM INTERFACE ${YAMLCPP_INCLUDE_DIR})
  target_link_libraries(seqpar_yaml INTERFACE ${YAMLCPP_LIBRARY})
  find_package(nlohmann_json 3 REQUIRED)
  add_library(seqpar_json INTERFACE)
  add_library(seqpar::json ALIAS seqpar_json)
  target_link_libraries(seqpar_json INTERFACE nlohmann_json::nlohmann_json)
endif()
if(SEQPAR_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()

# NVTX ranges (core/nvtx.h) where the toolkit has its header-only NVTX 3.
set(SEQPAR_WITH_NVTX OFF)
if(SEQPAR_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)
  if(TARGET CUDA::nvtx3)
    set(SEQPAR_WITH_NVTX ON)
  endif()
else()
  find_package(CUDAToolkit QUIET)  # for tests/core/philox_test.cpp's comparison only
endif()

# NCCL ships with the CUDA install here (/usr/local/cuda/{include,lib}) and as Debian's
# libnccl-dev elsewhere (/usr/include, /usr/lib/x86_64-linux-gnu).
set(SEQPAR_WITH_NCCL OFF )
if(SEQPAR_WITH_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
               ENV NCCL_HOME PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(seqpar_nccl INTERFACE)
    add_library(seqpar::nccl ALIAS seqpar_nccl)
    set_target_properties(seqpar_nccl PROPERTIES EXPORT_NAME nccl)
    install(TARGETS seqpar_nccl EXPORT seqparTargets)
    target_include_directories(seqpar_nccl INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(seqpar_nccl INTERFACE ${NCCL_LIBRARY})
    set(SEQPAR_WITH_NCCL ON )
    message(STATUS "seqpar: NCCL ${NCCL_LIBRARY}")
  else()
    message(STATUS "seqpar: NCCL not found; the NCCL process group is left out")
  endif()
endif()
