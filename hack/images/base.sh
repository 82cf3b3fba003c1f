# The images' Python base where no registry is reachable, sourced by build.sh:
# Debian's python3 in an essential-variant root filesystem (mmdebstrap), without
# docs, man pages, locales or the parts of the standard library nothing runs.
# Sets BASE to the image to build on.

# Paths dpkg leaves out (dpkg --path-exclude); the copyright files stay.
BASE_EXCLUDES=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')
# Parts of the standard library nothing in the images runs, removed after the
# install: python3.11's postinst byte-compiles every file it ships, so dpkg
# must have them (an excluded one fails the install). glibc's iconv modules
# (gconv, 8 MB) go too: Python has its own codecs.
BASE_REMOVED=(idlelib lib2to3 pydoc_data tkinter turtledemo test)
BASE_PACKAGES=python3,python3-venv,ca-certificates,libstdc++6

debian_base() {  # build (or reuse) the Debian base image; prints its name
  local suite key tarball image ctr opts=()
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  key=$( { echo "$suite $BASE_PACKAGES ${BASE_EXCLUDES[*]} ${BASE_REMOVED[*]} gconv"; cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null; } |
        sha256sum | cut -c1-12)
  tarball=$VG_CACHE/images/python-base-$suite-$key.tar image=vramguard.local/python-base:$suite-$key
  if "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then echo "$image"; return; fi
  if [[ ! -s $tarball ]]; then
    local t0=$SECONDS p
    for p in "${BASE_EXCLUDES[@]}"; do opts+=(--dpkgopt="path-exclude=$p"); done
    # merged-usr: /bin, /lib, /sbin as links into /usr, as Debian 12 installs it.
    mmdebstrap --quiet --variant=essential --format=tar --include="$BASE_PACKAGES" \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${opts[@]}" --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --customize-hook="cd \"\$1\"/usr/lib/python3.11 && rm -rf ${BASE_REMOVED[*]}" \
      --customize-hook='rm -rf "$1"/usr/lib/x86_64-linux-gnu/gconv' \
      --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
      "$suite" "$tarball.tmp" >"$tarball.log" 2>&1 || {
        echo "images: mmdebstrap failed ($tarball.log):" >&2; tail -n 20 "$tarball.log" >&2; return 1; }
    mv "$tarball.tmp" "$tarball"
    echo "images: Debian base $tarball in $((SECONDS - t0)) s ($(($(stat -c %s "$tarball") >> 20)) MiB)" >&2
  fi
  ctr=$("${buildah[@]}" from --quiet scratch)
  "${buildah[@]}" add --quiet "$ctr" "$tarball" / >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/bin:/usr/bin:/bin --cmd '["python3"]' "$ctr"
  "${buildah[@]}" commit --quiet "$ctr" "$image" >/dev/null
  "${buildah[@]}" rm "$ctr" >/dev/null
  echo "$image"
}

choose_base() {  # sets BASE: VG_IMAGE_BASE, else the slim image where a registry answers, else Debian's
  if [[ -n ${VG_IMAGE_BASE:-} ]]; then BASE=$VG_IMAGE_BASE; return; fi
  if timeout 20 skopeo inspect --raw "docker://$SLIM" >/dev/null 2>&1; then BASE=$SLIM; return; fi
  echo "images: no registry answers for $SLIM; building a Python base from Debian packages"
  BASE=$(debian_base) || exit 1
}

base_python() {  # the base's Python as 311, 312...; fails for a base it cannot know without running it
  case $BASE in
    "$SLIM") echo 312 ;;
    vramguard.local/python-base:*)  # Debian's python3, from the same apt sources
      apt-cache policy python3 | awk '/Candidate:/ {split($2, v, "."); print v[1] v[2]}' ;;
    *) return 1 ;;
  esac
}
