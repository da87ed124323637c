# hosttune probe: read-only. Prints sections "@@ht:NAME" ... "@@ht-end:NAME:RC".
# Shipped as-is to every host; no inventory value is ever interpolated into it.
# `sh -s -- ROOT` probes the image under ROOT (apply --root) instead of the running system:
# then every fact comes from files under ROOT, none from /proc, /sys or this machine's PATH.
export LC_ALL=C
R=${1:-/}; R=${R%/}
HT_PY0=$(command -v python3 2>/dev/null); HT_GPU=  # the caller's python3 may be the one with pynvml
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
sec() { n=$1; shift; printf '@@ht:%s\n' "$n"; "$@" 2>/dev/null; r=$?; printf '\n@@ht-end:%s:%s\n' "$n" "$r"; return $r; }

# Where a path of the image lies on this machine, through its links as the image resolves them (in_root, sent in
# front of this script: absolute targets inside ROOT, `..` never above it); on the running system, the path itself.
# Nothing, and a failure, for a path whose links loop: a folder read through it must be skipped, never globbed as /.
at() { if [ -n "$R" ]; then in_root "$R" "$1" all; else printf '%s\n' "$1"; fi; }
# The same path as the image names it (/usr/local/cuda-12.4, not ROOT/usr/local/cuda-12.4).
rresolve() { rr_p=$(in_root "$R" "$1" all) && printf '%s' "${rr_p#"$R"}"; }  # sec() keeps n: the names here are rr_*
# grep -H of paths inside the image, printed as the image sees them (/etc/x, not ROOT/etc/x).
rgrep() {
  rg_pat=$1; shift
  for rg_f in "$@"; do grep -s -- "$rg_pat" "$(at "$rg_f")" | while IFS= read -r rg_l; do printf '%s:%s\n' "$rg_f" "$rg_l"; done; done
}
inroot() { chroot "$R" "$@"; }
# has NAME PATH: the tool is on this host's PATH, or (for an image) at PATH inside it.
has() { if [ -n "$R" ]; then [ -x "$(at "$2")" ]; else command -v "$1" >/dev/null; fi; }

image_meta() {
  printf 'image:%s\n' "$R"
  rgrep '' /etc/os-release /etc/hostname
  [ -e "$(at /etc/os-release)" ] || rgrep '' /usr/lib/os-release | sed 's|^/usr/lib/os-release|/etc/os-release|'
  # the program /sbin/init names (a link's name even where its program is not in the image yet); none when it is
  # missing, which read as an init named "init"
  im_init=$(in_root "$R" /sbin/init) && { [ -e "$im_init" ] || [ -L "$im_init" ]; } && printf 'init:%s\n' "$(basename -- "$(rresolve /sbin/init)")"
  printf 'kernel-image:%s\n' "$(ls "$(at /lib/modules)" 2>/dev/null | sort -V | tail -n 1)"
  printf 'uid:%s\n' "$(id -u)"
}

image_system() {
  rgrep '^[[:space:]]*THP_MODE=' /etc/default/hosttune-thp
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/aarch64-linux-gnu; do
    dd=$(at "$d") || continue
    for f in "$dd"/libnvidia-ml.so.*; do [ -e "$f" ] && printf 'nvml-lib:%s\n' "$d/${f##*/}"; done
  done
  return 0
}

image_cuda() {
  c=$(in_root "$R" /usr/local/cuda) || return 1
  { [ -e "$c" ] || [ -L "$c" ]; } && printf 'symlink:%s\n' "$(rresolve /usr/local/cuda)"
  if d=$(at /usr/local); then for t in "$d"/cuda-*; do [ -d "$t" ] && printf 'toolkit:/usr/local/%s\n' "${t##*/}"; done; fi
  [ -x "$(at /usr/local/cuda/bin/nvcc)" ] && printf 'symlink-nvcc:%s\n' "$(inroot /usr/local/cuda/bin/nvcc --version | tail -n 2 | tr '\n' ' ')"
  inroot env -i HOME=/root PATH=/usr/bin:/bin TERM=dumb sh -lc \
    'printf "path:%s\nld:%s\nnvcc:%s\n" "$PATH" "$LD_LIBRARY_PATH" "$(command -v nvcc)"; nvcc --version 2>/dev/null | tail -n 2 | sed "s/^/nvcc-version:/"' < /dev/null
  return 0
}

image_services() {
  [ "$(basename -- "$(rresolve /sbin/init)")" = systemd ] || return 0
  for x in $HT_UNITS; do
    state=$(systemctl --root="$R" is-enabled "$x.service" 2>/dev/null | head -n 1)
    printf 'unit:Id=%s.service\nunit:LoadState=%s\nunit:UnitFileState=%s\nunit:\n' "$x" "$([ -n "$state" ] && echo loaded || echo not-found)" "$state"
  done
  boot_scripts
}

image_tools() {
  for t in /usr/bin/numactl /bin/numactl /usr/local/bin/numactl; do [ -x "$(at "$t")" ] && { printf 'numactl:%s\n' "$t"; break; }; done
  printf 'python3:%s\n' "$(inroot python3 --version 2>&1)"
  for d in /usr/bin /usr/local/bin; do
    d=$(at "$d") || continue
    for p in "$d"/python3.*; do
      case $p in *-config|*m) continue ;; esac
      [ -x "$p" ] && printf 'python:%s\n' "${p##*/}"
    done
  done
  return 0
}

meta() {
  grep -sH '' /etc/os-release /proc/sys/kernel/hostname /etc/machine-id /proc/sys/kernel/osrelease /proc/1/comm /proc/cmdline
  machine_id_store
  printf 'uid:%s\n' "$(id -u)"
}

# Where /etc/machine-id lives: a file mounted over it (systemd's made-up id, from /run, where the file was empty or
# 'uninitialized' and could not be written) or a tmpfs root is a new id at every boot, which names no machine.
machine_id_store() {
  grep -qs '^[^ ]* [^ ]* [^ ]* [^ ]* /etc/machine-id ' /proc/self/mountinfo && printf 'machine-id-mount:1\n'
  printf 'machine-id-fs:%s\n' "$(stat -f -c %T /etc/machine-id 2>/dev/null)"
}

bootloader() {
  g=$(at /etc/default/grub.d) || g=/nonexistent/grub.d  # a folder whose links loop holds no drop-in
  if [ -r "$(at /etc/default/grub)" ]; then
    ( . "$(at /etc/default/grub)"
      for f in "$g"/*.cfg; do [ -r "$f" ] && . "$f"; done
      printf 'source:grub\nargs:%s %s\n' "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" )
    # drop-ins that set the default line anew (not appending to it): read after hosttune's, they drop its parameters
    for f in "$g"/*.cfg; do
      grep -qs '^[[:space:]]*GRUB_CMDLINE_LINUX_DEFAULT=' "$f" || continue
      grep -qs '^[[:space:]]*GRUB_CMDLINE_LINUX_DEFAULT=.*GRUB_CMDLINE_LINUX_DEFAULT' "$f" || printf 'resets:/etc/default/grub.d/%s\n' "${f##*/}"
    done
  elif has grubby /usr/sbin/grubby; then
    printf 'source:grubby\n'
    if [ -n "$R" ]; then inroot grubby --info=DEFAULT; else grubby --info=DEFAULT; fi | sed -n 's/^args="\{0,1\}\([^"]*\)"\{0,1\}$/args:\1/p'
  elif [ -r "$(at /etc/kernel/cmdline)" ]; then
    printf 'source:/etc/kernel/cmdline\nargs:'; cat "$(at /etc/kernel/cmdline)"
  fi
}

gpu_pci() {
  for d in /sys/bus/pci/devices/*; do
    read -r v < "$d/vendor" 2>/dev/null || continue
    [ "$v" = 0x10de ] || continue
    read -r c < "$d/class" 2>/dev/null || continue
    case $c in 0x03*) ;; *) continue ;; esac
    printf 'device:%s\n' "${d##*/}"
    HT_GPU=1
    files=""
    for i in $(ls "$d/msi_irqs" 2>/dev/null); do files="$files /proc/irq/$i/smp_affinity_list"; done
    grep -sH '' "$d/numa_node" "$d/local_cpulist" "$d/power_state" "$d/current_link_speed" \
      "$d/current_link_width" "$d/max_link_speed" "$d/max_link_width" $files
  done
}

cuda() {
  # readlink -f of a missing path prints the path itself: only an existing /usr/local/cuda has a target
  { [ -e /usr/local/cuda ] || [ -L /usr/local/cuda ]; } && printf 'symlink:%s\n' "$(readlink -f /usr/local/cuda)"
  for t in /usr/local/cuda-*; do [ -d "$t" ] && printf 'toolkit:%s\n' "$t"; done
  [ -x /usr/local/cuda/bin/nvcc ] && printf 'symlink-nvcc:%s\n' "$(/usr/local/cuda/bin/nvcc --version | tail -n 2 | tr '\n' ' ')"
  env -i HOME=/root PATH=/usr/bin:/bin TERM=dumb sh -lc \
    'printf "path:%s\nld:%s\nnvcc:%s\n" "$PATH" "$LD_LIBRARY_PATH" "$(command -v nvcc)"; nvcc --version 2>/dev/null | tail -n 2 | sed "s/^/nvcc-version:/"' < /dev/null
}

packages() {
  if [ -r "$(at /var/lib/dpkg/status)" ]; then
    printf 'manager:apt\n'
    # One awk pass over dpkg's database: stack packages with versions, and holds
    # (apt-mark hold sets the dpkg selection; apt-mark showhold would load the whole apt cache).
    awk -v RS= -F '\n' '{
      p = v = s = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^Package: /) p = substr($i, 10)
        else if ($i ~ /^Version: /) v = substr($i, 10)
        else if ($i ~ /^Status: /) s = substr($i, 9)
      }
      if (s ~ / installed$/ && p ~ /^(nvidia|libnvidia|cuda|libcuda|datacenter-gpu|libcublas|libcudnn|libnccl|irqbalance|numactl)/)
        printf "pkg:%s\t%s\t%s\n", p, v, (s ~ /^hold/ ? "hi" : "ii")
      if (s ~ /^hold/) print "held:" p
    }' "$(at /var/lib/dpkg/status)"
  elif has rpm /usr/bin/rpm; then
    printf 'manager:dnf\n'
    if [ -n "$R" ]; then inroot rpm -qa --qf "$HT_RPM_QF"; else rpm -qa --qf "$HT_RPM_QF"; fi \
      | grep -E '^pkg:(nvidia|libnvidia|cuda|libcuda|kmod-nvidia|datacenter-gpu|libcublas|libcudnn|libnccl|irqbalance|numactl)'
    grep -hs . "$(at /etc/dnf/plugins/versionlock.list)" "$(at /etc/yum/pluginconf.d/versionlock.list)" | sed 's/^/lock:/'
  fi
  return 0
}

HT_RPM_QF='pkg:%{NAME}\t%{VERSION}-%{RELEASE}\tii\n'
HT_UNITS="irqbalance nvidia-persistenced hosttune-irq-affinity hosttune-cpu-governor hosttune-thp"
# The sha256 of each boot script hosttune's units run: the checks compare it with what apply would write now.
boot_scripts() {
  for x in hosttune-irq-affinity hosttune-cpu-governor; do
    f=$(at "/usr/local/sbin/$x") || continue
    [ -f "$f" ] && printf 'script:%s:%s\n' "$x" "$(sha256sum < "$f" | cut -d' ' -f1)"
  done
  return 0
}
services() {
  u=$HT_UNITS
  printf 'running:'; for p in /proc/[0-9]*/comm; do read -r c < "$p" 2>/dev/null && printf '%s ' "$c"; done; printf '\n'
  [ "$(cat /proc/1/comm)" = systemd ] || return 0
  for x in $u; do set -- "$@" "$x.service"; done
  systemctl show --property=Id,LoadState,ActiveState,UnitFileState "$@" | sed 's/^/unit:/'
  boot_scripts
}

system() {
  grep -sH '' /sys/devices/system/cpu/online /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor \
    /sys/devices/system/cpu/cpuidle/current_driver /sys/module/intel_idle/parameters/max_cstate \
    /sys/devices/system/cpu/cpu0/cpuidle/state*/name /sys/devices/system/cpu/cpu0/cpuidle/state*/disable \
    /sys/devices/system/cpu/cpu0/cpuidle/state*/latency /sys/devices/system/node/node*/cpulist \
    /proc/sys/kernel/numa_balancing /sys/kernel/mm/transparent_hugepage/enabled \
    /sys/module/nvme_core/parameters/default_ps_max_latency_us /sys/class/nvme/nvme*/model \
    /sys/class/nvme/nvme*/device/power_state /proc/driver/nvidia/version
  grep -sH '^[[:space:]]*THP_MODE=' /etc/default/hosttune-thp
  ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/aarch64-linux-gnu/libnvidia-ml.so.* 2>/dev/null | sed 's/^/nvml-lib:/'
  return 0
}

# Each file read through its links as the image resolves them (an absolute link names a file of the image, not of
# this machine), printed under its own name.
sc_one() { grep -s 'numa_balancing' -- "$(at "$1")" | while IFS= read -r line; do printf '%s:%s\n' "$1" "$line"; done; }
sysctl_conf() {
  sc_one /etc/sysctl.conf
  for d in /etc/sysctl.d /run/sysctl.d /usr/local/lib/sysctl.d /usr/lib/sysctl.d /lib/sysctl.d; do
    dd=$(at "$d") || continue
    for f in "$dd"/*.conf; do [ -e "$f" ] || [ -L "$f" ] && sc_one "$d/${f##*/}"; done
  done
  return 0
}

tools() {
  printf 'numactl:%s\n' "$(command -v numactl)"
  printf 'python3:%s\n' "$(python3 --version 2>&1)"
  for p in /usr/bin/python3.* /usr/local/bin/python3.*; do
    case $p in *-config|*m) continue ;; esac
    [ -x "$p" ] && printf 'python:%s\n' "${p##*/}"
  done
  return 0
}

# hosttune's own checks on this host (apply's monitor): the version in its virtualenv, its timers and their intervals
HT_MONITOR_TIMERS="hosttune-monitor.timer hosttune-monitor-active.timer"
monitor_state() {
  for d in /opt/hosttune-monitor/venv/lib/python3*/site-packages/hosttune-*.dist-info; do
    [ -d "$d" ] && printf 'installed:%s\n' "${d##*/}"
  done
  for t in $HT_MONITOR_TIMERS; do grep -s '^OnUnitActiveSec=' "/etc/systemd/system/$t" | sed "s/^/interval:$t:/"; done
  for f in /var/lib/hosttune/monitor/status.json /var/lib/hosttune/monitor/status-active.json \
      /etc/systemd/system/hosttune-monitor.timer /etc/systemd/system/hosttune-monitor-active.timer; do
    [ -f "$f" ] && printf 'written:%s:%s\n' "${f##*/}" "$(stat -c %Y "$f")"
  done
  printf 'now:%s\n' "$(date +%s)"
  [ "$(cat /proc/1/comm)" = systemd ] || return 0
  systemctl show --property=Id,LoadState,ActiveState,UnitFileState $HT_MONITOR_TIMERS | sed 's/^/unit:/'
  return 0
}

# ---- health probes: GPU faults, fabric, PCI errors, shared memory (read-only) ----
# sec() keeps the section's name in n: no function here may set n.
health_host() {
  grep -qs '^flags.* hypervisor' /proc/cpuinfo && printf 'hypervisor:yes\n'
  printf 'shm:%s\n' "$(df -Pk /dev/shm 2>/dev/null | tail -n 1)"
  grep -s ' /dev/shm ' /proc/mounts | sed 's/^/shm-mount:/'
  return 0
}

gpu_nodes() {  # read after the smoke test: the first CUDA call loads nvidia-uvm and makes its nodes
  [ -d /sys/module/nvidia_uvm ] && printf 'uvm-module:yes\n'
  for h_n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*; do
    [ -c "$h_n" ] && printf 'devnode:%s\n' "$h_n"
  done
  return 0
}

kernel_log() {  # Xid lines since boot: the ring buffer, else this boot's kernel journal
  if dmesg >/dev/null 2>&1; then printf 'source:dmesg\n'; l=$(dmesg | grep 'NVRM: Xid')
  elif journalctl -k -b -n 1 --no-pager >/dev/null 2>&1; then
    printf 'source:journal\n'; l=$(journalctl -k -b --no-pager -o cat | grep 'NVRM: Xid')
  else return 1
  fi
  [ -n "$l" ] || { printf 'total:0\n'; return 0; }
  printf 'total:%s\n' "$(printf '%s\n' "$l" | wc -l)"
  printf '%s\n' "$l" | tail -n 500 | sed 's/^/xid:/'
}

acs_ctl() {  # $1: a bridge's sysfs dir. Walks the extended capabilities to ACS (id 0x0d).
  [ "$(stat -c %s "$1/config" 2>/dev/null || echo 0)" -gt 256 ] || { printf 'none'; return; }  # conventional PCI
  o=256; i=0
  while [ $o -ge 256 ] && [ $i -lt 64 ]; do
    h=$(od -An -tu4 -j$o -N4 "$1/config" 2>/dev/null | tr -d ' ')
    [ -n "$h" ] || { printf 'unreadable'; return; }
    [ "$h" = 0 ] || [ "$h" = 4294967295 ] && break
    [ $((h & 65535)) = 13 ] && { od -An -tu2 -j$((o + 6)) -N2 "$1/config" | tr -d ' \n'; return; }
    o=$(( (h >> 20) & 4092 )); i=$((i + 1))
  done
  printf 'none'
}

pci_health() {  # AER counters of GPUs, NVSwitches and NICs; IOMMU and ACS on GPU paths
  for d in /sys/bus/pci/devices/*; do
    read -r v < "$d/vendor" 2>/dev/null || continue
    read -r c < "$d/class" 2>/dev/null || continue
    case $v:$c in 0x10de:0x03*) k=gpu ;; 0x10de:0x0680*) k=nvswitch ;; *:0x02*) k=nic ;; *) continue ;; esac
    b=${d##*/}
    printf 'dev:%s:%s\n' "$b" "$k"
    for f in aer_dev_correctable aer_dev_nonfatal aer_dev_fatal; do
      [ -r "$d/$f" ] && sed "s/^/aer:$b:$f:/" "$d/$f"
    done
    [ $k = gpu ] || continue
    [ -r "$d/iommu_group/type" ] && printf 'iommu:%s:%s\n' "$b" "$(cat "$d/iommu_group/type")"
    p=$(readlink -f "$d")
    for a in $(printf '%s\n' "${p#/sys/devices/pci*/}" | tr '/' ' '); do
      [ "$a" = "$b" ] && break
      [ -n "$h_root" ] || { h_root=$a; continue; }  # the root port itself is not a switch port
      printf 'acs:%s:%s:%s\n' "$a" "$b" "$(acs_ctl "/sys/bus/pci/devices/$a")"
    done
    h_root=
  done
  return 0
}

fabric_manager() {
  command -v nv-fabricmanager >/dev/null && printf 'version:%s\n' "$(nv-fabricmanager --version 2>&1 | head -n 1)"
  for p in /proc/[0-9]*/comm; do read -r c < "$p" 2>/dev/null; [ "$c" = nv-fabricmanage ] && { printf 'running:yes\n'; break; }; done
  [ "$(cat /proc/1/comm)" = systemd ] || return 0
  printf 'active:%s\nenabled:%s\n' "$(systemctl is-active nvidia-fabricmanager)" "$(systemctl is-enabled nvidia-fabricmanager)"
  return 0
}

cuda_python() {  # $@: arguments for the CUDA probe (libcuda through ctypes); 30 s keeps a hung GPU inside the probe timeout
  for py in "$HT_PY0" /usr/bin/python3; do
    [ -n "$py" ] && [ -x "$py" ] || continue
    if command -v timeout >/dev/null; then timeout "${HT_CUDA_TIMEOUT:-30}" "$py" -c "$HOSTTUNE_CUDA_PROBE" "$@"
    else "$py" -c "$HOSTTUNE_CUDA_PROBE" "$@"; fi
    return $?
  done
  return 127
}

torch_python() {  # the engine's virtualenv first, then the interpreters on PATH
  for py in /opt/hosttune/current/bin/python $(ls -td /opt/hosttune/releases/*/bin/python 2>/dev/null) "$HT_PY0" /usr/bin/python3; do
    [ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null && { printf '%s' "$py"; return 0; }
  done
  return 1
}

allreduce() {
  py=$(torch_python) || return 127
  timeout 120 "$py" -c "$HOSTTUNE_ALLREDUCE_PROBE"
}

health_gpu_first() {
  command -v nvidia-smi >/dev/null || return 0
  sec nvlink-status nvidia-smi nvlink -s
  sec nvlink-errors-1 nvidia-smi nvlink -e
  [ -n "$HT_XML" ] || sec smi-xml nvidia-smi -q -x
}

health_gpu_last() {
  sec cuda-smoke cuda_python smoke
  sec gpu-nodes gpu_nodes
  if [ -n "$HOSTTUNE_ACTIVE" ]; then
    HT_CUDA_TIMEOUT=$((HOSTTUNE_ACTIVE + 60)); sec active-load cuda_python load "$HOSTTUNE_ACTIVE"; HT_CUDA_TIMEOUT=
    command -v dcgmi >/dev/null && sec dcgm-diag timeout 300 dcgmi diag -r 1
    [ "$(ls -d /dev/nvidia[0-9]* 2>/dev/null | wc -l)" -ge 2 ] && sec allreduce allreduce
  fi
  command -v nvidia-smi >/dev/null && sec nvlink-errors-2 nvidia-smi nvlink -e
  # read again: the counts are since boot, so only what rose during the probe says where GPU IRQs go now
  [ -n "$HT_GPU" ] && sec interrupts-2 grep -E '^ +CPU0|nvidia' /proc/interrupts
  return 0
}
# ---- end of health probes ----


if [ -n "$R" ]; then
  is_os_root "$R" || exit 3  # it has said why not, in one line
fi
if [ -n "$R" ]; then
  # An image: no kernel, no devices, no processes; its files only.
  sec meta image_meta
  sec bootloader bootloader
  sec system image_system
  sec cuda image_cuda
  sec packages packages
  sec services image_services
  sec sysctl sysctl_conf
  sec tools image_tools
  exit 0
fi
sec meta meta
sec bootloader bootloader
sec system system
sec gpu-pci gpu_pci
[ -n "$HT_GPU" ] && sec interrupts grep -E '^ +CPU0|nvidia' /proc/interrupts
sec cuda cuda
sec packages packages
sec services services
sec sysctl sysctl_conf
sec tools tools
sec monitor monitor_state
sec health-host health_host
sec kernel-log kernel_log
sec pci-health pci_health
[ -e /sys/bus/pci/drivers/nvidia ] || command -v nv-fabricmanager >/dev/null && sec fabric fabric_manager
# A deployed engine or its nginx front: does it answer without a key? (an interpreter only where one is)
if [ -e /opt/hosttune/current ] || [ -n "$(ls /etc/nginx/conf.d/hosttune-*.conf 2>/dev/null)" ]; then
  command -v python3 >/dev/null && sec engine-access python3 -c "$HOSTTUNE_ACCESS_PROBE"
  # ... and are its units running, its ports answering, its front's upstreams up?
  command -v python3 >/dev/null && sec serve python3 -c "$HOSTTUNE_SERVE_PROBE"
fi
nvml() {
  r=127
  for py in "$HT_PY0" /usr/bin/python3; do
    [ -n "$py" ] && [ -x "$py" ] || continue
    "$py" -c "$HOSTTUNE_NVML_PROBE"; r=$?
    [ $r = 3 ] || return $r  # 3: no pynvml in this interpreter, try the next
  done
  return $r
}
# Interpreters cost ~50 ms each: ask NVML only where an NVIDIA GPU, driver or nvidia-smi is present.
[ -n "$HT_GPU" ] || [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null || exit 0
if ! sec nvml nvml && command -v nvidia-smi >/dev/null; then
  sec smi-xml nvidia-smi -q -x; HT_XML=1
  sec smi-csv nvidia-smi --query-gpu=index,name,pci.bus_id,pstate,persistence_mode,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version,compute_cap --format=csv
fi
health_gpu_first
health_gpu_last
exit 0
