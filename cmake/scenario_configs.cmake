# Writes SCENARIO_CONFIGS_OUTPUT, a C++ source holding each scenario's defaults: its file
# in configs/, compiled in, so that `--scenario NAME` runs exactly what
# `--config configs/NAME.toml` runs. Included by apps/repro/CMakeLists.txt; also run as a
# script by scripts/fuzz.sh, which builds the config readers without CMake:
#   cmake -DSCENARIO_CONFIGS_OUTPUT=FILE -P cmake/scenario_configs.cmake
get_filename_component(scenario_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(scenario_entries "")
foreach(pair IN ITEMS issue-6868:issue6868 zero-stage:zero-stage shifted-targets:shifted-targets
        clipping-norms:clipping-norms dropout:dropout masked-tokens:masked-tokens
        ulysses:ulysses context-parallel:context_parallel)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 scenario)
  list(GET pair 1 file)
  set(path ${scenario_root}/configs/${file}.toml)
  if(NOT CMAKE_SCRIPT_MODE_FILE)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
  endif()
  file(READ ${path} text)
  string(APPEND scenario_entries
         "    {\"${scenario}\", \"configs/${file}.toml\", R\"seqpar_toml(${text})seqpar_toml\"},\n")
endforeach()
configure_file(${scenario_root}/apps/repro/scenario_configs.cpp.in ${SCENARIO_CONFIGS_OUTPUT} @ONLY)
