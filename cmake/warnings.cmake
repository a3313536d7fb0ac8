# Warning flags for every memsnap target (a list, applied with ms_target_warnings()).
set(MS_WARNING_FLAGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
    -Wpointer-arith -Wformat=2 -Wvla -Wno-unused-parameter)
if(MS_WERROR)
  list(APPEND MS_WARNING_FLAGS -Werror)
endif()
function(ms_target_warnings target)
  target_compile_options(${target} PRIVATE ${MS_WARNING_FLAGS})
  target_compile_definitions(${target} PRIVATE MS_DEBUG=${MS_DEBUG})
endfunction()
