# `cmake --build <dir> --target format` reformats the sources with .clang-format;
# `--target format-check` fails if any would change; `--target tidy` runs clang-tidy over
# compile_commands.json (libuv's `tidy`). Lists come from git so nothing is globbed by hand.
find_program(MS_CLANG_FORMAT NAMES clang-format clang-format-14)
find_program(MS_CLANG_TIDY NAMES clang-tidy clang-tidy-14)
find_package(Git QUIET)
if(GIT_FOUND)
  set(_ms_ls ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} ls-files -- *.c *.h)
  if(MS_CLANG_FORMAT)
    add_custom_target(format COMMAND ${_ms_ls} | xargs ${MS_CLANG_FORMAT} -i
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} VERBATIM)
    add_custom_target(format-check COMMAND ${_ms_ls} | xargs ${MS_CLANG_FORMAT} --dry-run -Werror
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} VERBATIM)
  endif()
  if(MS_CLANG_TIDY)
    add_custom_target(tidy COMMAND ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} ls-files -- lib/*.c viz/*.c cli/*.c
      | xargs ${MS_CLANG_TIDY} -p ${PROJECT_BINARY_DIR} --quiet
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} VERBATIM)
  endif()
endif()
