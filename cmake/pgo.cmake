# Profile-guided optimisation (MS_PGO, docs/performance.md "Release builds"): a build tree made
# twice by scripts/pgo-build.sh. GENERATE instruments every object (each run of a program adds its
# counts to the .gcda file beside each object; atomic updates, since compare and view run
# threads); scripts/pgo-train.sh runs the command on real snapshots; USE builds the same tree
# again from those counts. An object without counts (not run in training, or changed since) is
# optimised as without a profile: -fprofile-partial-training, no error on a missing or stale one.
# GCC only (clang's profiles are another format and tool): with another compiler MS_PGO is ignored.
set(MS_PGO "OFF" CACHE STRING "Profile-guided optimisation: OFF, GENERATE or USE (scripts/pgo-build.sh).")
set_property(CACHE MS_PGO PROPERTY STRINGS OFF GENERATE USE)

if(MS_PGO STREQUAL "OFF")
  return()
endif()
if(NOT MS_PGO MATCHES "^(GENERATE|USE)$")
  message(FATAL_ERROR "MS_PGO=${MS_PGO}: expected OFF, GENERATE or USE")
endif()
if(MS_SANITIZE OR MS_TSAN)
  message(FATAL_ERROR "MS_PGO is for release trees, not with MS_SANITIZE or MS_TSAN")
endif()
if(NOT CMAKE_C_COMPILER_ID STREQUAL "GNU")
  message(WARNING "MS_PGO=${MS_PGO} needs GCC (${CMAKE_C_COMPILER_ID} here): built without it")
  return()
endif()
# With the profile, link-time optimisation: the reader's hot path calls across its files (the
# entry's fields, its frames, the objects' bookkeeping), which only the link can inline; the
# profile says where. Measured in docs/dev/measurements.md: the profile alone took 5 % of
# `timeline`'s instructions, with link-time optimisation 14 %. (The static archives of such a
# tree then hold GCC's LTO objects: a release tree is for the command, the wheel and the benches.)
include(CheckIPOSupported)
check_ipo_supported(RESULT ms_ipo OUTPUT ms_ipo_why LANGUAGES C)
if(ms_ipo)
  set(CMAKE_INTERPROCEDURAL_OPTIMIZATION ON)
else()
  message(STATUS "MS_PGO: no link-time optimisation here (${ms_ipo_why})")
endif()
if(MS_PGO STREQUAL "GENERATE")
  add_compile_options(-fprofile-generate -fprofile-update=atomic)
  add_link_options(-fprofile-generate)
else()
  add_compile_options(-fprofile-use -fprofile-partial-training -fprofile-correction
                      -Wno-missing-profile -Wno-error=coverage-mismatch)
endif()
