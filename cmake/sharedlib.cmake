# ms_shared_library(<target> <output name> <export name> [RPATH]): the properties of one of memsnap's public
# shared libraries (lib/, viz/): lib<output>.so.<major> as its soname, lib<output>.so.<version> as
# its file, in <build>/lib next to the static archive. [RPATH]: the RUNPATH, the same in the build
# tree and installed (BUILD_WITH_INSTALL_RPATH: CMake would otherwise pad a shorter build RPATH with
# empty entries, which the loader reads as the current directory); "$ORIGIN" lets libmemsnap_viz
# find libmemsnap_core wherever the tree is moved.
# Symbols are hidden by default (CMAKE_C_VISIBILITY_PRESET): only MS_API functions are exported.
function(ms_shared_library target output export)
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output} EXPORT_NAME ${export}
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
    BUILD_WITH_INSTALL_RPATH ON
    INSTALL_RPATH "${ARGN}")
  if(NOT MS_SANITIZE AND NOT MS_TSAN) # the sanitizers' runtime symbols are resolved by the program
    target_link_options(${target} PRIVATE -Wl,--no-undefined)
  endif()
endfunction()
