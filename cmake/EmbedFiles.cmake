# jobguard_embed_files(OUT_VAR NAMESPACE ns FILES a.lua b.lua)
# Generates a .cpp defining `extern const std::string_view ns::<stem>` for each
# file, so Lua scripts live in their own files yet ship inside the library.
function(jobguard_embed_files out_var)
  cmake_parse_arguments(EMB "" "NAMESPACE;NAME" "FILES" ${ARGN})
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${EMB_NAME}.cpp")
  set(deps)
  foreach(f IN LISTS EMB_FILES)
    get_filename_component(abs "${f}" ABSOLUTE)
    list(APPEND deps "${abs}")
  endforeach()
  add_custom_command(OUTPUT "${out}"
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DNS=${EMB_NAMESPACE} "-DFILES=${deps}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFilesRun.cmake
    DEPENDS ${deps} ${PROJECT_SOURCE_DIR}/cmake/EmbedFilesRun.cmake
    VERBATIM)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
