# The headers as a user includes them: <seqpar/core/tensor.h>, <seqpar/seqpar.h>, and the
# generated <seqpar/config.h> and <seqpar/version.h>.
#
# The sources include one another by their path from the root ("core/tensor.h"), so the
# root of the layers is an include directory, and installed it is include/seqpar. Users
# write <seqpar/...>, with include/ as the include directory. Both directories are on the
# targets' include path (and in seqpar.pc's Cflags), in the build tree as installed:
#
#   installed                          build tree
#   include/seqpar/config.h            <build>/include/seqpar/config.h   (generated)
#   include/seqpar/version.h           <build>/include/seqpar/version.h  (generated)
#   include/seqpar/seqpar.h            <build>/include/seqpar/seqpar.h   -> include/seqpar/seqpar.h
#   include/seqpar/core/tensor.h       <build>/include/seqpar/core       -> core/   (and so on)
#
# The build tree links to the sources instead of copying them, so an edited header is
# what the next build sees.
#
# Also run as a script by scripts/fuzz.sh, which compiles some sources without CMake and
# needs a CPU-only config.h:
#   cmake -DSEQPAR_GENERATED_INCLUDE_DIR=DIR -P cmake/headers.cmake

set(SEQPAR_PUBLIC_LAYERS core autograd nn optim dist)
get_filename_component(seqpar_headers_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

configure_file(${seqpar_headers_root}/include/seqpar/config.h.in
               ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/config.h @ONLY)
if(CMAKE_SCRIPT_MODE_FILE)
  return()
endif()
configure_file(include/seqpar/version.h.in ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/version.h @ONLY)
foreach(layer IN LISTS SEQPAR_PUBLIC_LAYERS)
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${layer}
       ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/${layer} SYMBOLIC)
endforeach()
file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/seqpar/seqpar.h
     ${SEQPAR_GENERATED_INCLUDE_DIR}/seqpar/seqpar.h SYMBOLIC)
