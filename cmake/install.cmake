# cmake --install: the executables, the libraries a program links (static, with their
# headers), and a CMake package so that a LibTorch program can find_package(muster) and link
# muster::worker. Dependencies are found again by musterConfig.cmake (find_dependency).
#
# Three components, which cmake/package.cmake makes into Debian packages: runtime (the
# programs, their man pages, the Python package, the systemd unit, the Slurm and Kubernetes
# files), dev (headers, static libraries, the CMake package) and nccl (nccl_check and
# muster::nccl, which need NCCL and the CUDA runtime at run time).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(muster_programs launch rendezvousd rendezvousctl)
set(muster_libraries muster_common muster_proto muster_rendezvous muster_worker_env)
set(muster_header_dirs common rendezvous)
set(MUSTER_PACKAGE_HAS_WORKER OFF)
if(TARGET muster_worker)
  list(APPEND muster_programs worker)
  list(APPEND muster_libraries muster_worker)
  set(MUSTER_PACKAGE_HAS_WORKER ON)
endif()
set(MUSTER_MAN_PROGRAMS ${muster_programs})

# muster::common, muster::rendezvous, muster::worker, ... for consumers.
foreach(lib ${muster_libraries} muster_nccl)
  if(NOT TARGET ${lib})
    continue()
  endif()
  string(REPLACE "muster_" "" short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
endforeach()

install(TARGETS ${muster_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS ${muster_libraries} EXPORT musterTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/muster)
if(TARGET muster_nccl)
  # An export set of its own: musterConfig.cmake loads it where it was installed.
  install(TARGETS nccl_check RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT nccl)
  install(TARGETS muster_nccl EXPORT musterNcclTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT nccl)
  install(EXPORT musterNcclTargets NAMESPACE muster:: DESTINATION ${config_dir} COMPONENT nccl)
endif()

# Headers keep their folders: include/muster/worker/process_group.h,
# include/muster/rendezvous/store/store.h. The worker library's
# headers (not the example programs'), and the generated wire API headers.
install(DIRECTORY common rendezvous DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster COMPONENT dev
        FILES_MATCHING PATTERN "*.h" PATTERN "*_test*" EXCLUDE PATTERN "programs" EXCLUDE
        PATTERN "session_stream.h" EXCLUDE PATTERN "store_session.h" EXCLUDE)  # the client's own
install(DIRECTORY worker DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster COMPONENT dev
        FILES_MATCHING PATTERN "*.h" PATTERN "*_test*" EXCLUDE PATTERN "programs" EXCLUDE)
install(DIRECTORY ${MUSTER_PROTO_GEN_DIR}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster
        COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(DIRECTORY proto/ DESTINATION ${CMAKE_INSTALL_DATADIR}/muster/proto COMPONENT dev
        FILES_MATCHING PATTERN "*.proto")
install(DIRECTORY deploy/slurm deploy/k8s DESTINATION ${CMAKE_INSTALL_DATADIR}/muster
        COMPONENT runtime)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
# The pages the README links to, with the figures they show, as they lie beside it in the tree.
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT runtime
        FILES_MATCHING PATTERN "*.md" PATTERN "*.svg")

# The systemd unit where systemd looks under the prefix (/usr/lib/systemd/system for a
# package, /usr/local/lib/systemd/system for a source install), its ExecStart= and
# Documentation= naming the installed files. Written straight to the destination: a file in
# the build folder would be shared by installs that run at once.
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/rendezvousd.service\" unit)
  string(REGEX REPLACE \"(\\n(ExecStart|Documentation)=(file://)?)/usr/local/\"
         \"\\\\1\${CMAKE_INSTALL_PREFIX}/\" unit \"\${unit}\")
  set(dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\")
  file(MAKE_DIRECTORY \"\${dir}\")
  file(WRITE \"\${dir}/rendezvousd.service\" \"\${unit}\")
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/rendezvousd.service\")
  message(STATUS \"Installing: \${dir}/rendezvousd.service\")" COMPONENT runtime)

# The Python package (python/muster, pure Python) into Python's site directory under the
# install prefix: lib/python3.X/dist-packages on Debian (on sys.path for /usr and /usr/local),
# site-packages elsewhere. MUSTER_PYTHON_SITE (relative to the prefix, or absolute) overrides.
if(NOT DEFINED MUSTER_PYTHON_SITE)
  find_program(MUSTER_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(MUSTER_PYTHON3 NAMES python3)
  set(site "")
  if(MUSTER_PYTHON3)
    execute_process(
      COMMAND ${MUSTER_PYTHON3} -c "import sysconfig as s
p = s.get_path('purelib', 'posix_prefix', vars={'base': '', 'platbase': ''}).lstrip('/')
print(p.replace('site-packages', 'dist-packages') if 'deb_system' in s.get_scheme_names() else p)"
      OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(site STREQUAL "")
    set(site ${CMAKE_INSTALL_LIBDIR}/python3/site-packages)
  endif()
  set(MUSTER_PYTHON_SITE ${site} CACHE STRING "where cmake --install puts the muster Python package")
endif()
# Under /usr (a Debian package) it goes where Debian puts pure Python modules for every
# Python 3, lib/python3/dist-packages.
install(CODE "
  set(site \"${MUSTER_PYTHON_SITE}\")
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\" AND NOT IS_ABSOLUTE \"\${site}\")
    set(site lib/python3/dist-packages)
  endif()
  if(NOT IS_ABSOLUTE \"\${site}\")
    set(site \"\${CMAKE_INSTALL_PREFIX}/\${site}\")
  endif()
  file(INSTALL \"${PROJECT_SOURCE_DIR}/python/muster\" DESTINATION \"\${site}\"
       FILES_MATCHING PATTERN \"*.py\" PATTERN \"__pycache__\" EXCLUDE)" COMPONENT runtime)

install(EXPORT musterTargets NAMESPACE muster:: DESTINATION ${config_dir} COMPONENT dev)
configure_package_config_file(cmake/musterConfig.cmake.in
  ${PROJECT_BINARY_DIR}/musterConfig.cmake INSTALL_DESTINATION ${config_dir}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/musterConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/musterConfig.cmake ${PROJECT_BINARY_DIR}/musterConfigVersion.cmake
        DESTINATION ${config_dir} COMPONENT dev)
