# Our own targets build clean with -Wall -Wextra, and a new warning fails the build (turn
# MUSTER_WARNINGS_AS_ERRORS off for a compiler newer than the one the code was checked with).
# Generated code (muster_proto) and other projects' headers (imported targets, SYSTEM) are not ours.
option(MUSTER_WARNINGS_AS_ERRORS "Fail the build on a warning in muster's own code" ON)

function(muster_enforce_warnings dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$"
       AND NOT t MATCHES "^muster(_etcd)?_proto$")
      # Two of -Wextra's are off: -Wmissing-field-initializers, since designated initializers
      # that leave members at their defaults are how our option structs are meant to be
      # filled ({.host = ..., .port = ...}); and GCC 12's -Wrestrict, a false positive inside
      # libstdc++'s std::string at -O3 (GCC bug 105651).
      target_compile_options(${t} PRIVATE -Wall -Wextra -Wno-missing-field-initializers
                             $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>
                             $<$<BOOL:${MUSTER_WARNINGS_AS_ERRORS}>:-Werror>)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    muster_enforce_warnings(${sub})
  endforeach()
endfunction()
