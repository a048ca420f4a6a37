# Man pages: help2man turns each program's --help and --version into PROGRAM.1, gzipped as
# Debian asks, built with the programs and installed with them (component runtime). Without
# help2man the build goes on without them (deploy/setup.sh installs it).
find_program(MUSTER_HELP2MAN help2man)
find_program(MUSTER_GZIP gzip)
if(NOT MUSTER_HELP2MAN OR NOT MUSTER_GZIP)
  message(STATUS "muster: help2man or gzip not found; no man pages")
  return()
endif()
set(muster_man_launch "launch workers like torchrun, with muster's store and rendezvous")
set(muster_man_rendezvousd "muster's store and rendezvous service")
set(muster_man_rendezvousctl "talk to a muster store")
set(muster_man_worker "muster's example programs and the worker self-check")
set(man_pages)
foreach(program ${MUSTER_MAN_PROGRAMS})
  set(page ${PROJECT_BINARY_DIR}/man/${program}.1)
  add_custom_command(OUTPUT ${page}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
    COMMAND ${MUSTER_HELP2MAN} --no-info --section=1 --name=${muster_man_${program}}
            --output=${page} $<TARGET_FILE:${program}>
    COMMAND ${MUSTER_GZIP} -9nf ${page}
    DEPENDS ${program} VERBATIM)
  list(APPEND man_pages ${page}.gz)
endforeach()
add_custom_target(muster_man_pages ALL DEPENDS ${man_pages})
install(FILES ${man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
