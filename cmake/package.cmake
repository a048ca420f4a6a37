# Debian packages with CPack: `cpack -G DEB` in the build folder (or `cmake --build build
# --target package`) writes packages/muster_<version>_amd64.deb (the runtime component),
# muster-dev_<version>_amd64.deb (headers, static libraries, CMake package) and, where NCCL
# comes from a Debian package, muster-nccl (nccl_check and muster::nccl).
#
# Nothing is hand-listed that the contents do not need: the programs' Depends come from
# dpkg-shlibdeps; muster-dev's from the Debian packages that own what musterConfig.cmake and
# the installed headers use, found here with dpkg-query.

# muster_owning_packages(OUT FILE...): the Debian packages owning FILEs ("" where dpkg has none).
function(muster_owning_packages out)
  set(packages)
  foreach(file ${ARGN})
    if(NOT EXISTS "${file}")
      continue()
    endif()
    execute_process(COMMAND dpkg-query -S "${file}" OUTPUT_VARIABLE owner ERROR_QUIET
                    RESULT_VARIABLE failed OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT failed AND owner MATCHES "^([^:, ]+)")
      list(APPEND packages ${CMAKE_MATCH_1})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES packages)
  set(${out} "${packages}" PARENT_SCOPE)
endfunction()

find_program(MUSTER_DPKG_QUERY dpkg-query)
find_program(MUSTER_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(NOT MUSTER_DPKG_QUERY OR NOT MUSTER_DPKG_SHLIBDEPS)
  message(STATUS "muster: dpkg-query or dpkg-shlibdeps not found (dpkg-dev); no Debian packages")
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
# What Python workers and Slurm jobs use, not the programs themselves.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "python3-torch, slurm-client")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/cmake/debian/postinst)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME muster-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_DESCRIPTION
"muster's C++ worker library: headers, static libraries and CMake package
find_package(muster) gives muster::worker (the job's environment, the c10d
store adapter, Gloo groups and the shared-directory channel) and
muster::rendezvous (the store client and server) to LibTorch programs.")
muster_owning_packages(dev_depends
  ${gRPC_DIR}/gRPCConfig.cmake /usr/include/grpcpp/grpcpp.h
  ${Protobuf_INCLUDE_DIR}/google/protobuf/message.h
  ${absl_DIR}/abslConfig.cmake ${spdlog_DIR}/spdlogConfig.cmake ${Boost_DIR}/BoostConfig.cmake
  ${OPENSSL_INCLUDE_DIR}/openssl/ssl.h)
if(Torch_FOUND)
  find_path(MUSTER_XXHASH_INCLUDE xxhash.h)
  muster_owning_packages(torch_depends ${Torch_DIR}/TorchConfig.cmake
                         ${MUSTER_XXHASH_INCLUDE}/xxhash.h)
  list(APPEND dev_depends ${torch_depends})
endif()
list(PREPEND dev_depends "muster (= ${PROJECT_VERSION})")
list(JOIN dev_depends ", " CPACK_DEBIAN_DEV_PACKAGE_DEPENDS)

set(CPACK_COMPONENTS_ALL runtime dev)
if(TARGET muster_nccl)
  # Packaged only where NCCL and the CUDA runtime come from Debian packages: elsewhere (a
  # CUDA toolkit in /usr/local/cuda) no Depends line could name them.
  muster_owning_packages(nccl_owners ${NCCL_LIBRARY} ${CUDART_LIBRARY})
  list(LENGTH nccl_owners owned)
  if(owned EQUAL 2)
    list(APPEND CPACK_COMPONENTS_ALL nccl)
    set(CPACK_DEBIAN_NCCL_PACKAGE_NAME muster-nccl)
    set(CPACK_DEBIAN_NCCL_PACKAGE_SECTION libdevel)
    set(CPACK_DEBIAN_NCCL_PACKAGE_DEPENDS "muster-dev (= ${PROJECT_VERSION})")
    set(CPACK_DEBIAN_NCCL_DESCRIPTION "muster's NCCL communicator and nccl_check\nmuster::nccl and the nccl_check program, for NCCL groups from muster's store.")
  else()
    message(STATUS "muster: NCCL is not from a Debian package (${NCCL_LIBRARY}); no muster-nccl package")
  endif()
endif()
include(CPack)
