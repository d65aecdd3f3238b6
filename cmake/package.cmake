# The Debian packages (make package; docs/packaging.md): what the packages carry beyond the
# programs and the library (the man page, docs, systemd units, /etc/rekindle's settings,
# copyright and changelog), and CPack's DEB generator, one package per install COMPONENT:
#   rekindle      rk and what it runs with (CMakeLists.txt's install rules)
#   librekindle0  librekindle.so.0
#   rekindle-dev  headers, rekindle.pc, the librekindle.so link
# Included from CMakeLists.txt after its install rules. The packages want a build tree
# configured with -DCMAKE_INSTALL_PREFIX=/usr (GNUInstallDirs then gives /etc and the
# multiarch libdir), which is what `make package` does.

set(RK_PKG_DIR ${CMAKE_CURRENT_SOURCE_DIR}/packaging)
set(RK_FULL_SYSCONFDIR ${CMAKE_INSTALL_FULL_SYSCONFDIR})
set(RK_FULL_DOCDIR ${CMAKE_INSTALL_FULL_DOCDIR})
# systemd's unit directory: Debian 12's /lib/systemd/system for a /usr prefix, else the
# prefix's lib/systemd/system (systemd also reads /usr/local/lib/systemd/system).
# The settings likewise: /etc for a /usr prefix (what GNUInstallDirs makes of it), else the
# prefix's etc/, so that cmake --install --prefix keeps them under that prefix.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(RK_SYSTEMD_UNITDIR_DEFAULT /lib/systemd/system)
  set(RK_SYSCONFDIR ${CMAKE_INSTALL_FULL_SYSCONFDIR})
else()
  set(RK_SYSTEMD_UNITDIR_DEFAULT lib/systemd/system)
  set(RK_SYSCONFDIR ${CMAKE_INSTALL_SYSCONFDIR})
endif()
set(RK_SYSTEMD_UNITDIR ${RK_SYSTEMD_UNITDIR_DEFAULT} CACHE STRING
  "where the systemd units are installed (relative: under the prefix)")

# ---- generated at build time ----------------------------------------------------------------
# The man page from the help texts (scripts/gen-man.sh), dated by the changelog's last entry,
# so that the same sources give the same bytes.
file(STRINGS ${RK_PKG_DIR}/changelog RK_CHANGELOG_TRAILER REGEX "^ -- " LIMIT_COUNT 1)
string(REGEX MATCH "([0-9]+) ([A-Z][a-z][a-z]) ([0-9][0-9][0-9][0-9])" _ "${RK_CHANGELOG_TRAILER}")
set(_months Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec)
list(FIND _months "${CMAKE_MATCH_2}" _month)
if(_month LESS 0)
  message(FATAL_ERROR "packaging/changelog: no date in its first ' -- ' line: ${RK_CHANGELOG_TRAILER}")
endif()
math(EXPR _month "${_month} + 1")
string(LENGTH "${CMAKE_MATCH_1}" _dlen)
set(_day ${CMAKE_MATCH_1})
if(_dlen EQUAL 1)
  set(_day 0${_day})
endif()
if(_month LESS 10)
  set(_month 0${_month})
endif()
set(RK_MAN_DATE ${CMAKE_MATCH_3}-${_month}-${_day})

# rk runs here (rk --help): without LeakSanitizer's exit status in a sanitised build.
add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/rk.1.gz
  COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0
    bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gen-man.sh $<TARGET_FILE:rk>
    ${CMAKE_CURRENT_BINARY_DIR}/rk.1.gz ${PROJECT_VERSION} ${RK_MAN_DATE}
  DEPENDS rk ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gen-man.sh ${RK_PKG_DIR}/changelog
  COMMENT "rk.1.gz: the man page from rk's help texts" VERBATIM)
# The changelog as Debian wants it in the doc directory: gzip -9n (no name, no time stamp).
add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
  COMMAND sh -c "gzip -9n <\"$0\" >\"$1\"" ${RK_PKG_DIR}/changelog
    ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
  DEPENDS ${RK_PKG_DIR}/changelog COMMENT "changelog.gz" VERBATIM)
add_custom_target(rk_package_files ALL
  DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/rk.1.gz ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz)

# The units, with this build's paths.
foreach(unit rk-exporter.service rk-tune.service)
  configure_file(deploy/systemd/${unit}.in ${CMAKE_CURRENT_BINARY_DIR}/systemd/${unit} @ONLY)
endforeach()

# ---- install rules --------------------------------------------------------------------------
# rk run's look-up of the Python package (share/rekindle/python): a relative link to it where
# it is installed elsewhere (Debian's dist-packages in the package).
set(RK_PYTHON_RUN_DIR ${CMAKE_INSTALL_DATADIR}/rekindle/python)
if(NOT RK_PYTHON_INSTALL_DIR STREQUAL RK_PYTHON_RUN_DIR)
  file(RELATIVE_PATH _rel ${CMAKE_INSTALL_PREFIX}/${RK_PYTHON_RUN_DIR}
    ${CMAKE_INSTALL_PREFIX}/${RK_PYTHON_INSTALL_DIR}/rekindle)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/pylink)
  file(CREATE_LINK ${_rel} ${CMAKE_CURRENT_BINARY_DIR}/pylink/rekindle SYMBOLIC)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pylink/rekindle DESTINATION ${RK_PYTHON_RUN_DIR}
    COMPONENT rekindle)
endif()
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/rk.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
  COMPONENT rekindle)
# The docs: the README and docs/*.md, and deploy/'s examples (Prometheus config and rules,
# Grafana dashboard, Kubernetes, Slurm) as plain files.
file(GLOB RK_DOCS CONFIGURE_DEPENDS docs/*.md)
install(FILES README.md ${RK_DOCS} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT rekindle)
install(DIRECTORY deploy/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT rekindle
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
  PATTERN systemd EXCLUDE)
install(FILES ${RK_PKG_DIR}/copyright ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT rekindle)
# Left out of a plain cmake --install (make install): the units, the settings in /etc, and
# what only a package needs (the other packages' doc directories, lintian's overrides).
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/systemd/rk-exporter.service
  ${CMAKE_CURRENT_BINARY_DIR}/systemd/rk-tune.service
  DESTINATION ${RK_SYSTEMD_UNITDIR} COMPONENT rekindle EXCLUDE_FROM_ALL)
install(FILES deploy/systemd/exporter.conf deploy/systemd/tune.conf
  DESTINATION ${RK_SYSCONFDIR}/rekindle COMPONENT rekindle EXCLUDE_FROM_ALL)
foreach(pkg rekindle librekindle0 rekindle-dev)
  if(NOT pkg STREQUAL "rekindle")
    install(FILES ${RK_PKG_DIR}/copyright ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${pkg} EXCLUDE_FROM_ALL)
  endif()
  if(EXISTS ${RK_PKG_DIR}/${pkg}.lintian-overrides)
    install(FILES ${RK_PKG_DIR}/${pkg}.lintian-overrides
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides RENAME ${pkg}
      COMPONENT ${pkg} EXCLUDE_FROM_ALL)
  endif()
endforeach()

# ---- CPack: the .deb files ------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rekindle)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "rekindle maintainers <maintainers@users.noreply.a-seed-6ef21d9b.example>")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL rekindle librekindle0 rekindle-dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Runtime libraries by dpkg-shlibdeps (dpkg-dev) from what the ELF files link, and a shlibs
# file for librekindle0 so that what links it depends on it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_REKINDLE_PACKAGE_NAME rekindle)
set(CPACK_DEBIAN_REKINDLE_PACKAGE_SECTION utils)
# Beyond the libraries: mpirun (rk run launches its ranks with it), python3 and xxhash for the
# Python package (its checkpoints); the data set rk train reads is only suggested.
set(CPACK_DEBIAN_REKINDLE_PACKAGE_DEPENDS "openmpi-bin, python3, python3-xxhash")
set(CPACK_DEBIAN_REKINDLE_PACKAGE_SUGGESTS "dataset-fashion-mnist")
set(CPACK_DEBIAN_REKINDLE_PACKAGE_CONTROL_EXTRA ${RK_PKG_DIR}/conffiles)
set(CPACK_COMPONENT_REKINDLE_DESCRIPTION "training on unreliable GPUs: rk, its services and Python package
rekindle keeps a training job going on GPUs that fail: rk run supervises the
ranks through crashes, hangs and silent corruption (checkpoints, rollbacks,
quarantine of the failing device), rk doctor scores a node's GPUs, rk tune
applies stability settings, rk exporter serves their health to Prometheus and
rk device-plugin offers them to Kubernetes.

This package has the rk command, its man page, the rekindle Python package,
the documentation and two systemd units: rk-exporter.service and
rk-tune.service (settings in /etc/rekindle; neither is enabled).")

set(CPACK_DEBIAN_LIBREKINDLE0_PACKAGE_NAME librekindle0)
set(CPACK_DEBIAN_LIBREKINDLE0_PACKAGE_SECTION libs)
# dpkg's ldconfig trigger, and empty maintainer scripts in place of the ldconfig calls CPack
# would write otherwise (docs/packaging.md, lintian's overrides).
set(CPACK_DEBIAN_LIBREKINDLE0_PACKAGE_CONTROL_EXTRA ${RK_PKG_DIR}/librekindle0/triggers
  ${RK_PKG_DIR}/librekindle0/postinst ${RK_PKG_DIR}/librekindle0/postrm)
set(CPACK_COMPONENT_LIBREKINDLE0_DESCRIPTION "training on unreliable GPUs: the librekindle shared library
rekindle keeps a training job going on GPUs that fail. librekindle is what a
trainer links: checkpoints, heartbeats to rk run, the compressed allreduce and
the node's health readings.

This package has the shared library.")

set(CPACK_DEBIAN_REKINDLE-DEV_PACKAGE_NAME rekindle-dev)
set(CPACK_DEBIAN_REKINDLE-DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_REKINDLE-DEV_PACKAGE_DEPENDS "librekindle0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_REKINDLE-DEV_DESCRIPTION "training on unreliable GPUs: librekindle's headers
rekindle keeps a training job going on GPUs that fail. librekindle is what a
trainer links: checkpoints, heartbeats to rk run, the compressed allreduce and
the node's health readings.

This package has the headers, the pkg-config file rekindle.pc and the
librekindle.so link, to build a program against librekindle.")

include(CPack)
