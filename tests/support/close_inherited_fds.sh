# Sourced by the test scripts that run mmdebstrap: closes every descriptor past stderr that
# the script inherited, so that none reaches what it runs. mmdebstrap's hooks write to
# descriptors it opens, named in dash (`cat >&11`), which reads one digit only, so any
# descriptor held by the script or by whoever started it (ctest, a CI shell) pushed them past
# 9 and mmdebstrap failed ("Bad fd number"). Bash keeps the script's own descriptor
# close-on-exec.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  ((fd > 2)) && eval "exec $fd>&-"
done
