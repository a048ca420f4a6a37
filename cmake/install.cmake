# cmake --install: the executables, the libraries a program links (static, with their
# headers), and a CMake package so that a LibTorch program can find_package(muster) and link
# muster::worker. Dependencies are found again by musterConfig.cmake (find_dependency).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(muster_programs launch rendezvousd rendezvousctl)
set(muster_libraries muster_common muster_proto muster_rendezvous muster_worker_env)
set(muster_header_dirs common rendezvous)
set(MUSTER_PACKAGE_HAS_WORKER OFF)
set(MUSTER_PACKAGE_HAS_NCCL OFF)
if(TARGET muster_worker)
  list(APPEND muster_programs worker)
  list(APPEND muster_libraries muster_worker)
  set(MUSTER_PACKAGE_HAS_WORKER ON)
endif()
if(TARGET muster_nccl)
  list(APPEND muster_programs nccl_check)
  list(APPEND muster_libraries muster_nccl)
  set(MUSTER_PACKAGE_HAS_NCCL ON)
endif()

# muster::common, muster::rendezvous, muster::worker, ... for consumers.
foreach(lib ${muster_libraries})
  string(REPLACE "muster_" "" short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
endforeach()

install(TARGETS ${muster_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${muster_libraries} EXPORT musterTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# Headers keep their folders: include/muster/worker/process_group.h. The worker library's
# headers (not the example programs'), and the generated wire API headers.
install(DIRECTORY common rendezvous DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster
        FILES_MATCHING PATTERN "*.h" PATTERN "*_test*" EXCLUDE)
install(DIRECTORY worker DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster
        FILES_MATCHING PATTERN "*.h" PATTERN "*_test*" EXCLUDE PATTERN "programs" EXCLUDE)
install(DIRECTORY ${MUSTER_PROTO_GEN_DIR}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/muster
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY proto/ DESTINATION ${CMAKE_INSTALL_DATADIR}/muster/proto
        FILES_MATCHING PATTERN "*.proto")
install(DIRECTORY deploy/slurm deploy/k8s deploy/systemd DESTINATION ${CMAKE_INSTALL_DATADIR}/muster)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

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
install(DIRECTORY python/muster DESTINATION ${MUSTER_PYTHON_SITE}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/muster)
install(EXPORT musterTargets NAMESPACE muster:: DESTINATION ${config_dir})
configure_package_config_file(cmake/musterConfig.cmake.in
  ${PROJECT_BINARY_DIR}/musterConfig.cmake INSTALL_DESTINATION ${config_dir}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/musterConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/musterConfig.cmake ${PROJECT_BINARY_DIR}/musterConfigVersion.cmake
        DESTINATION ${config_dir})
