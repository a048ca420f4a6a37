# Sanitizer builds: -DMUSTER_SANITIZE=address,undefined or -DMUSTER_SANITIZE=thread builds every
# target of the project (programs, libraries, tests) with that sanitizer; tests/sanitize.sh makes
# such a build in a folder of its own and runs the suite under it.
#
# The sanitizers' run-time options are built into each program (cmake/sanitizer_options.cc.in),
# not left to ASAN_OPTIONS and the like: launch, rendezvousd and the tests' helpers are started
# by tests that hand them an environment of their own, and an option lost on the way would turn
# a finding into a pass. Each report is written to the build's sanitizer-reports/ folder as well
# (what a test does with a child's stderr cannot hide it); the environment's *SAN_OPTIONS still
# add to or override the built-in ones.
set(MUSTER_SANITIZE "" CACHE STRING "Sanitizers to build with: address,undefined (either or both) or thread")

set(MUSTER_SANITIZER_REPORTS "${PROJECT_BINARY_DIR}/sanitizer-reports")
if(MUSTER_SANITIZE)
  string(REPLACE "," ";" wanted "${MUSTER_SANITIZE}")
  foreach(s IN LISTS wanted)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "MUSTER_SANITIZE: '${s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST wanted AND ("address" IN_LIST wanted))
    message(FATAL_ERROR "MUSTER_SANITIZE: thread cannot be combined with address")
  endif()
  # -O1 keeps the reports' stacks whole and the suite within its time; UBSan stops at its first
  # report, as ASan and TSan do, so that a finding fails the process that made it.
  add_compile_options(-fsanitize=${MUSTER_SANITIZE} -fno-omit-frame-pointer -g -O1)
  add_link_options(-fsanitize=${MUSTER_SANITIZE})
  # GCC's flow analysis under the sanitizers' instrumentation warns of uninitialized members
  # inside libstdc++'s std::regex and std::function (GCC 12 at -O1); the warning stays on in
  # the ordinary build, where it is exact.
  add_compile_options($<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
  # Boost.Asio fences its handlers' invocation with std::atomic_thread_fence, which TSan does
  # not model (GCC 12 warns, -Wtsan); the handlers reach their threads through the scheduler's
  # mutex, which TSan sees, so what the fence orders is ordered for it too.
  if("thread" IN_LIST wanted)
    add_compile_options($<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
  endif()
  if("undefined" IN_LIST wanted)
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  # gRPC, Protobuf and Abseil shared: TSan's suppressions name their libraries' frames, and a
  # program mapping them statically would carry their code under our name.
  set(MUSTER_STATIC_DEPS OFF)
  file(MAKE_DIRECTORY ${MUSTER_SANITIZER_REPORTS})
  foreach(kind tsan lsan)
    file(READ ${PROJECT_SOURCE_DIR}/tests/sanitize/${kind}.supp text)
    string(TOUPPER ${kind} upper)
    set(MUSTER_${upper}_SUPPRESSIONS_RAW "R\"supp(${text})supp\"")
  endforeach()
  # A suppressions file changed is a new configure (and a new sanitizer_options.cc).
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
               ${PROJECT_SOURCE_DIR}/tests/sanitize/tsan.supp ${PROJECT_SOURCE_DIR}/tests/sanitize/lsan.supp)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/sanitizer_options.cc.in
                 ${PROJECT_BINARY_DIR}/sanitizer_options.cc @ONLY)
  message(STATUS "muster: built with -fsanitize=${MUSTER_SANITIZE}; reports in ${MUSTER_SANITIZER_REPORTS}")
endif()

# muster_add_sanitizer_options(DIR): every executable under DIR gets the built-in options.
function(muster_add_sanitizer_options dir)
  if(NOT MUSTER_SANITIZE)
    return()
  endif()
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    get_target_property(imported ${t} IMPORTED)
    if(type STREQUAL "EXECUTABLE" AND NOT imported)
      target_sources(${t} PRIVATE ${PROJECT_BINARY_DIR}/sanitizer_options.cc)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    muster_add_sanitizer_options(${sub})
  endforeach()
endfunction()

# Fuzzing: -DMUSTER_FUZZ=ON (clang only; tests/fuzz.sh) instruments every target for libFuzzer
# under ASan and UBSan and links the fuzz targets (fuzz/) with libFuzzer's main. Reports go to
# stderr, where libFuzzer reads them: not combined with MUSTER_SANITIZE's built-in options.
option(MUSTER_FUZZ "Build the fuzz targets with libFuzzer (clang), the whole build under ASan and UBSan" OFF)
if(MUSTER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MUSTER_FUZZ needs clang (libFuzzer): CXX=clang++-14 cmake ...; tests/fuzz.sh does it")
  endif()
  if(MUSTER_SANITIZE)
    message(FATAL_ERROR "MUSTER_FUZZ brings its own sanitizers: leave MUSTER_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -g -O1)
  add_link_options(-fsanitize=address,undefined)
  set(MUSTER_STATIC_DEPS OFF)
endif()
