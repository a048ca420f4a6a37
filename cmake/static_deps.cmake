# muster_link_static_deps(<program>): links <program> against the static archives of gRPC,
# Protobuf and Abseil (and what they pull in: re2, upb, c-ares, zlib) instead of their shared
# libraries, with its own static libraries in one group. The dynamic loader then has a handful
# of libraries to map and relocate instead of about sixty: `launch --version` starts in 2-3 ms
# instead of 7-12, which is most of what a trivial job pays for launch.
#
# What parses the network's bytes before gRPC does stays shared, so that its security updates
# reach the program without a rebuild: OpenSSL, c-ares (DNS replies) and zlib. gRPC, Protobuf,
# Abseil, re2 and upb are in the program: an update of those needs muster rebuilt. Programs
# that load LibTorch must not use this (LibTorch brings its own Protobuf and Abseil).
#
# The archives must be those of the gRPC, Protobuf and Abseil that find_package found: they
# are looked for only beside the shared libraries those targets name, and pkg-config's
# versions must be theirs. MUSTER_STATIC_DEPS=OFF, CMake before 3.24 ($<LINK_GROUP>) or a
# system without the archives links everything shared.
option(MUSTER_STATIC_DEPS "Link launch and rendezvousctl against static gRPC, Protobuf and Abseil" ON)

set(MUSTER_STATIC_ARCHIVES "")
if(MUSTER_STATIC_DEPS)
  set(missing "")
  if(CMAKE_VERSION VERSION_LESS 3.24)
    set(missing " CMake 3.24 or later ($<LINK_GROUP>)")
  endif()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(MUSTER_GRPC_PC QUIET grpc++ protobuf absl_statusor absl_strings
                      absl_synchronization)
  endif()
  if(NOT MUSTER_GRPC_PC_FOUND)
    string(APPEND missing " pkg-config files of grpc++, protobuf and absl")
  elseif(NOT MUSTER_GRPC_PC_grpc++_VERSION VERSION_EQUAL gRPC_VERSION
         OR NOT MUSTER_GRPC_PC_protobuf_VERSION VERSION_EQUAL Protobuf_VERSION)
    string(APPEND missing " pkg-config's grpc++ ${MUSTER_GRPC_PC_grpc++_VERSION} and protobuf"
           " ${MUSTER_GRPC_PC_protobuf_VERSION} are not the gRPC ${gRPC_VERSION} and Protobuf"
           " ${Protobuf_VERSION} found")
  endif()
  # Where the shared libraries the targets name are.
  set(dirs "")
  foreach(target gRPC::grpc++ gRPC::gpr absl::base)
    get_target_property(location ${target} LOCATION)
    if(location)
      get_filename_component(dir "${location}" DIRECTORY)
      list(APPEND dirs "${dir}")
    endif()
  endforeach()
  get_filename_component(dir "${Protobuf_LIBRARY}" DIRECTORY)
  list(APPEND dirs "${dir}")
  list(REMOVE_DUPLICATES dirs)
  set(seen "")
  foreach(name IN LISTS MUSTER_GRPC_PC_STATIC_LIBRARIES)
    # The C library's parts, and what parses the network's bytes, stay shared.
    if(missing OR name MATCHES "^(dl|rt|m|pthread|atomic|ssl|crypto|cares|z)$" OR name IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${name})
    find_library(MUSTER_STATIC_${name} NAMES lib${name}.a HINTS ${dirs} NO_DEFAULT_PATH)
    if(MUSTER_STATIC_${name})
      list(APPEND MUSTER_STATIC_ARCHIVES ${MUSTER_STATIC_${name}})
    else()
      string(APPEND missing " lib${name}.a in ${dirs}")
    endif()
  endforeach()
  if(missing)
    message(STATUS "muster: linking shared gRPC, Protobuf and Abseil (missing:${missing})")
    set(MUSTER_STATIC_ARCHIVES "")
  else()
    list(LENGTH MUSTER_STATIC_ARCHIVES count)
    message(STATUS "muster: launch and rendezvousctl link ${count} static archives of gRPC, Protobuf and Abseil")
  endif()
endif()

# The static libraries of this project that <target> links, directly or through others.
function(muster_own_static_libraries target out)
  set(found "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue current)
    get_target_property(deps ${current} LINK_LIBRARIES)
    if(NOT deps)
      continue()
    endif()
    foreach(dep IN LISTS deps)
      if(NOT TARGET ${dep} OR dep IN_LIST found)
        continue()
      endif()
      get_target_property(imported ${dep} IMPORTED)
      get_target_property(type ${dep} TYPE)
      if(NOT imported AND type STREQUAL "STATIC_LIBRARY")
        list(APPEND found ${dep})
        list(APPEND queue ${dep})
      endif()
    endforeach()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

function(muster_link_static_deps target)
  if(NOT MUSTER_STATIC_ARCHIVES)
    return()
  endif()
  # One group, rescanned: the project's archives and the dependencies' resolve each other in
  # any order. The shared libraries the targets name still follow it; --as-needed drops those
  # that the group left with nothing to give.
  muster_own_static_libraries(${target} own)
  string(JOIN "," members ${own} ${MUSTER_STATIC_ARCHIVES})
  target_link_libraries(${target} PRIVATE "$<LINK_GROUP:RESCAN,${members}>")
  target_link_options(${target} PRIVATE "LINKER:--as-needed")
endfunction()
