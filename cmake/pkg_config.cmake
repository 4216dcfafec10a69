# seqpar.pc, installed to <libdir>/pkgconfig, for a program built without CMake:
#
#   export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig
#   c++ -std=c++17 app.cpp $(pkg-config --cflags --libs seqpar)
#
# It says what seqpar::nn, seqpar::optim and seqpar::dist say to a CMake consumer:
#   Cflags  both include roots (cmake/headers.cmake) and the include directories of the
#           dependencies that public headers include (Eigen; with CUDA, the toolkit's
#           and NCCL's). No -D: <seqpar/config.h> carries the build's configuration.
#   Libs    every seqpar library, each before the ones it uses (nn and optim, autograd,
#           dist, core), then what they link: -pthread and, with CUDA, cudart and NCCL.
#           The libraries' own private dependencies (cuRAND, cuBLASLt) join Libs where
#           the libraries are static archives (the default), Libs.private where shared.
#
# And seqpar-cpu.pc, for a program that runs on the CPU alone: the same without any CUDA
# library, NCCL or their include directories. In a CUDA build it names the CPU package
# (the seqpar_cpu_* libraries, and include/seqpar-cpu first, whose <seqpar/config.h>
# says "no CUDA"); in a CPU-only build it says what seqpar.pc says.

# The prefix relative to the .pc file, so that `cmake --install --prefix P` anywhere
# gives a file that points into P.
function(seqpar_pc_directory variable install_dir)
  if(IS_ABSOLUTE "${install_dir}")
    set(${variable} "${install_dir}" PARENT_SCOPE)
  else()
    set(${variable} "\${prefix}/${install_dir}" PARENT_SCOPE)
  endif()
endfunction()
file(RELATIVE_PATH SEQPAR_PC_PREFIX_FROM_PCFILEDIR
     /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" SEQPAR_PC_PREFIX_FROM_PCFILEDIR "${SEQPAR_PC_PREFIX_FROM_PCFILEDIR}")
seqpar_pc_directory(SEQPAR_PC_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
seqpar_pc_directory(SEQPAR_PC_LIBDIR ${CMAKE_INSTALL_LIBDIR})

set(cflags "-I\${includedir}" "-I\${includedir}/seqpar")
get_target_property(eigen_include_dirs Eigen3::Eigen INTERFACE_INCLUDE_DIRECTORIES)
foreach(dir IN LISTS eigen_include_dirs)
  list(APPEND cflags "-I${dir}")
endforeach()

set(layers_in_link_order nn optim autograd dist core)  # each before the ones it uses
set(libs "-L\${libdir}")
set(cpu_libs "-L\${libdir}")
foreach(layer IN LISTS layers_in_link_order)
  list(APPEND libs -lseqpar_${layer})
  if(SEQPAR_BUILD_CPU_VARIANT)
    list(APPEND cpu_libs -lseqpar_cpu_${layer})
  else()
    list(APPEND cpu_libs -lseqpar_${layer})
  endif()
endforeach()
list(APPEND cpu_libs -pthread)
set(cpu_cflags ${cflags})
if(SEQPAR_BUILD_CPU_VARIANT)
  list(PREPEND cpu_cflags "-I\${includedir}/seqpar-cpu")
endif()
set(private_libs "")
if(SEQPAR_WITH_NCCL)
  list(APPEND cflags "-I${NCCL_INCLUDE_DIR}")
  list(APPEND libs "${NCCL_LIBRARY}")
endif()
if(SEQPAR_WITH_CUDA)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND cflags "-I${dir}")
  endforeach()
  list(APPEND libs "-L${CUDAToolkit_LIBRARY_DIR}" -lcudart)
  list(APPEND private_libs -lcublasLt -lcurand)
endif()
list(APPEND libs -pthread)
if(NOT BUILD_SHARED_LIBS)
  list(APPEND libs ${private_libs})
  set(private_libs "")
endif()

list(REMOVE_DUPLICATES cflags)
list(JOIN cflags " " SEQPAR_PC_CFLAGS)
list(JOIN libs " " SEQPAR_PC_LIBS)
list(JOIN private_libs " " SEQPAR_PC_LIBS_PRIVATE)
set(SEQPAR_PC_NAME seqpar)
set(SEQPAR_PC_DESCRIPTION "")
configure_file(cmake/seqpar.pc.in ${PROJECT_BINARY_DIR}/install/seqpar.pc @ONLY)

set(SEQPAR_PC_NAME seqpar-cpu)
set(SEQPAR_PC_DESCRIPTION " (the CPU backend alone: no CUDA, no NCCL)")
list(JOIN cpu_cflags " " SEQPAR_PC_CFLAGS)
list(JOIN cpu_libs " " SEQPAR_PC_LIBS)
set(SEQPAR_PC_LIBS_PRIVATE "")
configure_file(cmake/seqpar.pc.in ${PROJECT_BINARY_DIR}/install/seqpar-cpu.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/install/seqpar.pc ${PROJECT_BINARY_DIR}/install/seqpar-cpu.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
