# Run at every build (cmake -P): writes OUT, the values behind `--version`, when they changed.
#   -DSOURCE_DIR= -DOUT= -DVERSION= -DNCCL=ON|OFF -DNCCL_HEADER=
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${SOURCE_DIR}/.git")
  # safe.directory: a tree owned by another user (sudo ./deploy/test.sh) is still ours.
  execute_process(COMMAND "${GIT_EXECUTABLE}" -c "safe.directory=${SOURCE_DIR}" -C "${SOURCE_DIR}"
                          describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE described OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE failed)
  if(NOT failed AND described)
    set(commit "${described}")
  endif()
endif()
# launch, rendezvousd and worker have no NCCL code: NCCL is muster::nccl and nccl_check.
set(nccl "not built (no muster::nccl, no nccl_check)")
if(NCCL)
  set(nccl "built (muster::nccl, nccl_check)")
  if(EXISTS "${NCCL_HEADER}")
    file(STRINGS "${NCCL_HEADER}" defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} +([0-9]+)" _ "${defines}")
      set(${part} "${CMAKE_MATCH_1}")
    endforeach()
    if(NOT MAJOR STREQUAL "")
      set(nccl "${MAJOR}.${MINOR}.${PATCH} built (muster::nccl, nccl_check)")
    endif()
  endif()
endif()
set(content "// Written by cmake/build_info.cmake at build time.
#define MUSTER_BUILD_VERSION \"${VERSION}\"
#define MUSTER_BUILD_COMMIT \"${commit}\"
#define MUSTER_BUILD_NCCL \"${nccl}\"
")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
