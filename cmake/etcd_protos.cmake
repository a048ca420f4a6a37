# muster_unpack_etcd_protos(<dir>): fetches Debian's golang-etcd-server-dev .deb with
# `apt-get download` (no root needed, nothing installed) and unpacks its .proto files under
# <dir>, as the package lays them out (<dir>/usr/share/gocode/src/go.etcd.io/...). Runs at
# configure time, once per build folder; fails with one line saying what to do.
function(muster_unpack_etcd_protos dir)
  find_program(MUSTER_APT_GET apt-get)
  find_program(MUSTER_DPKG_DEB dpkg-deb)
  find_program(MUSTER_TAR tar)
  set(how "install golang-etcd-server-dev, or set MUSTER_ETCD_PROTO_ROOT")
  if(NOT MUSTER_APT_GET OR NOT MUSTER_DPKG_DEB OR NOT MUSTER_TAR)
    message(FATAL_ERROR "etcd's .proto files are not installed and apt-get, dpkg-deb or tar is "
                        "missing to fetch them: ${how}")
  endif()
  set(download "${dir}.download")
  file(REMOVE_RECURSE "${download}" "${dir}")
  file(MAKE_DIRECTORY "${download}")
  message(STATUS "muster: fetching etcd's .proto files (apt-get download golang-etcd-server-dev)")
  execute_process(COMMAND "${MUSTER_APT_GET}" download -q golang-etcd-server-dev
                  WORKING_DIRECTORY "${download}"
                  RESULT_VARIABLE failed OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(GLOB debs "${download}/golang-etcd-server-dev_*.deb")
  if(failed OR NOT debs)
    string(STRIP "${err}" err)
    message(FATAL_ERROR "apt-get download golang-etcd-server-dev failed (${err}); run "
                        "apt-get update first, or ${how}")
  endif()
  list(GET debs 0 deb)
  # Unpacked into a temporary folder and renamed: a configure cut short leaves no half a tree
  # that the next one would take for whole.
  set(partial "${dir}.partial")
  file(REMOVE_RECURSE "${partial}")
  file(MAKE_DIRECTORY "${partial}")
  execute_process(COMMAND "${MUSTER_DPKG_DEB}" --fsys-tarfile "${deb}"
                  COMMAND "${MUSTER_TAR}" -x -C "${partial}" --wildcards "*.proto"
                  RESULTS_VARIABLE results ERROR_VARIABLE err)
  if(NOT results STREQUAL "0;0")
    string(STRIP "${err}" err)
    message(FATAL_ERROR "unpacking ${deb} failed (${err}): ${how}")
  endif()
  file(RENAME "${partial}" "${dir}")
  file(REMOVE_RECURSE "${download}")
endfunction()
