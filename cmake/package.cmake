# Debian packages with CPack: `cpack -G DEB` in the build folder (or `cmake --build build
# --target package`) writes packages/muster_<version>_amd64.deb (the runtime component),
# muster-dev_<version>_amd64.deb (headers, static libraries, CMake package) and, where NCCL
# comes from a Debian package, muster-nccl (nccl_check and muster::nccl).
#
# Nothing is hand-listed that the contents do not need: the programs' Depends come from
# dpkg-shlibdeps; muster-dev's from the Debian packages that own what musterConfig.cmake and
# the installed headers use, found here with dpkg-query.

# muster_owning_packages(OUT [REQUIRED] FILE...): the Debian packages owning FILEs, asked of
# dpkg-query once for all of them; a FILE no package owns is left out, with a warning where
# REQUIRED is given.
function(muster_owning_packages out)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "REQUIRED" "" "")
  # dpkg knows files by the path its package installed, not through symlinks
  # (/usr/local/cuda -> /etc/alternatives/...); ask for both.
  set(files)
  set(paths)
  foreach(file ${ARG_UNPARSED_ARGUMENTS})
    if(EXISTS "${file}")
      file(REAL_PATH "${file}" real)
      list(APPEND files "${file}")
      list(APPEND paths "${file}" "${real}")
    endif()
  endforeach()
  set(packages)
  if(paths)
    list(REMOVE_DUPLICATES paths)
    # It fails when any path has no package; the others are still answered.
    execute_process(COMMAND ${MUSTER_DPKG_QUERY} -S ${paths} OUTPUT_VARIABLE answers ERROR_QUIET)
    string(REPLACE "\n" ";" answers "${answers}")
    foreach(line ${answers})  # "libgrpc-dev:amd64: /usr/lib/...": the first package names it
      string(FIND "${line}" ": /" colon)
      if(colon GREATER 0 AND line MATCHES "^([^:, ]+)")
        math(EXPR at "${colon} + 2")
        string(SUBSTRING "${line}" ${at} -1 path)
        set("owner:${path}" ${CMAKE_MATCH_1})
      endif()
    endforeach()
  endif()
  foreach(file ${files})
    file(REAL_PATH "${file}" real)
    set(asked "owner:${file}")
    set(resolved "owner:${real}")
    if(DEFINED "${asked}")
      list(APPEND packages ${${asked}})
    elseif(DEFINED "${resolved}")
      list(APPEND packages ${${resolved}})
    elseif(ARG_REQUIRED)
      message(WARNING "muster: no Debian package owns ${file}: the package's Depends cannot name it")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES packages)
  set(${out} "${packages}" PARENT_SCOPE)
endfunction()

# muster_imported_files(OUT CONFIG_DIR): every file the exported targets of a CMake package in
# CONFIG_DIR must find (its *Targets-*.cmake check them all when loaded: Debian's gRPC, for
# one, fails find_package without /usr/bin/grpc_cpp_plugin, of protobuf-compiler-grpc).
function(muster_imported_files out dir)
  set(files)
  file(GLOB targets "${dir}/*Targets.cmake")
  foreach(main ${targets})
    # The prefix: the file's folder, then one up for each further get_filename_component.
    file(STRINGS "${main}" ups REGEX "^ *get_filename_component\\(_IMPORT_PREFIX ")
    get_filename_component(prefix "${main}" DIRECTORY)
    list(LENGTH ups count)
    while(count GREATER 1)
      get_filename_component(prefix "${prefix}" DIRECTORY)
      math(EXPR count "${count} - 1")
    endwhile()
    string(REGEX REPLACE "Targets\\.cmake$" "Targets-*.cmake" pattern "${main}")
    file(GLOB configs "${pattern}")
    foreach(config ${configs})
      file(STRINGS "${config}" lines REGEX "_cmake_import_check_files_for_")
      foreach(line ${lines})
        string(REGEX MATCHALL "\"[^\"]+\"" quoted "${line}")
        foreach(q ${quoted})
          string(REPLACE "\"" "" path "${q}")
          string(REPLACE "\${_IMPORT_PREFIX}" "${prefix}" path "${path}")
          list(APPEND files "${path}")
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES files)
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

find_program(MUSTER_DPKG_QUERY dpkg-query)
find_program(MUSTER_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(MUSTER_FILE file)  # CPack's shlibdeps step picks the ELF files with it
if(NOT MUSTER_DPKG_QUERY OR NOT MUSTER_DPKG_SHLIBDEPS OR NOT MUSTER_FILE)
  message(STATUS "muster: dpkg-query, dpkg-shlibdeps (dpkg-dev) or file not found; no Debian packages")
  return()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME muster)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "muster developers <muster-dev@lists.example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "torchrun-compatible launcher and rendezvous service")
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/muster-dev/muster")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME muster)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
"torchrun-compatible launcher and rendezvous service for PyTorch and LibTorch
launch starts distributed PyTorch and LibTorch jobs with torchrun's flags and
environment, hosts the store and rendezvous on node 0, and says which rank
failed or hung. rendezvousd is the store and rendezvous as a service (with a
systemd unit), rendezvousctl its command-line client, and worker the example
programs and the self-check. The Python package muster gives Python workers
the job's store and the shared-directory channel.")
# The Python package wants python3 (and torch); Slurm jobs slurm-client. The programs need
# none of them, so they are not Depends.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "python3")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "python3-torch, slurm-client")
# The unit (daemon-reload, stop on removal) and the Python modules' byte code (py3compile,
# py3clean), as debhelper's scripts would.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/cmake/debian/postinst
    ${PROJECT_SOURCE_DIR}/cmake/debian/prerm ${PROJECT_SOURCE_DIR}/cmake/debian/postrm)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME muster-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_DESCRIPTION
"muster's C++ worker library: headers, static libraries and CMake package
find_package(muster) gives muster::worker (the job's environment, the c10d
store adapter, Gloo groups and the shared-directory channel) and
muster::rendezvous (the store client and server) to LibTorch programs.")
set(imported)
foreach(dir ${gRPC_DIR} ${absl_DIR} ${spdlog_DIR})
  muster_imported_files(files ${dir})
  list(APPEND imported ${files})
endforeach()
muster_owning_packages(dev_depends REQUIRED ${imported}
  ${gRPC_DIR}/gRPCConfig.cmake /usr/include/grpcpp/grpcpp.h
  ${Protobuf_INCLUDE_DIR}/google/protobuf/message.h
  ${absl_DIR}/abslConfig.cmake ${spdlog_DIR}/spdlogConfig.cmake ${Boost_DIR}/BoostConfig.cmake
  ${OPENSSL_INCLUDE_DIR}/openssl/ssl.h)
if(Torch_FOUND)
  find_path(MUSTER_XXHASH_INCLUDE xxhash.h)
  muster_owning_packages(torch_depends REQUIRED ${Torch_DIR}/TorchConfig.cmake
                         ${MUSTER_XXHASH_INCLUDE}/xxhash.h)
  list(APPEND dev_depends ${torch_depends})
endif()
list(PREPEND dev_depends "muster (= ${PROJECT_VERSION})")
list(JOIN dev_depends ", " CPACK_DEBIAN_DEV_PACKAGE_DEPENDS)

set(CPACK_COMPONENTS_ALL runtime dev)
if(TARGET muster_nccl)
  # Packaged only where NCCL and the CUDA runtime come from Debian packages: elsewhere (a
  # CUDA toolkit in /usr/local/cuda) no Depends line could name them.
  muster_owning_packages(nccl_library_owners ${NCCL_LIBRARY})
  muster_owning_packages(cudart_owners ${CUDART_LIBRARY})
  if(nccl_library_owners AND cudart_owners)
    # nccl_check's libraries come from shlibdeps; muster::nccl's consumers need the headers.
    muster_owning_packages(nccl_dev_owners ${NCCL_INCLUDE_DIR}/nccl.h
                           ${CUDA_RUNTIME_INCLUDE_DIR}/cuda_runtime_api.h)
    list(APPEND CPACK_COMPONENTS_ALL nccl)
    set(CPACK_DEBIAN_NCCL_PACKAGE_NAME muster-nccl)
    set(CPACK_DEBIAN_NCCL_PACKAGE_SECTION libdevel)
    set(nccl_depends "muster-dev (= ${PROJECT_VERSION})" ${nccl_dev_owners})
    list(JOIN nccl_depends ", " CPACK_DEBIAN_NCCL_PACKAGE_DEPENDS)
    set(CPACK_DEBIAN_NCCL_DESCRIPTION "muster's NCCL communicator and nccl_check\nmuster::nccl and the nccl_check program, for NCCL groups from muster's store.")
  else()
    message(STATUS "muster: NCCL is not from a Debian package (${NCCL_LIBRARY}); no muster-nccl package")
  endif()
endif()
include(CPack)
