# hosttune probe: read-only. Prints sections "@@ht:NAME" ... "@@ht-end:NAME:RC".
# Shipped as-is to every host; no inventory value is ever interpolated into it.
export LC_ALL=C
HT_PY0=$(command -v python3 2>/dev/null); HT_GPU=  # the caller's python3 may be the one with pynvml
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
sec() { n=$1; shift; printf '@@ht:%s\n' "$n"; "$@" 2>/dev/null; r=$?; printf '\n@@ht-end:%s:%s\n' "$n" "$r"; return $r; }

meta() {
  grep -sH '' /etc/os-release /proc/sys/kernel/hostname /proc/sys/kernel/osrelease /proc/1/comm /proc/cmdline
  printf 'uid:%s\n' "$(id -u)"
}

bootloader() {
  if [ -r /etc/default/grub ]; then
    ( . /etc/default/grub
      for f in /etc/default/grub.d/*.cfg; do [ -r "$f" ] && . "$f"; done
      printf 'source:grub\nargs:%s %s\n' "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" )
  elif command -v grubby >/dev/null; then
    printf 'source:grubby\n'; grubby --info=DEFAULT | sed -n 's/^args="\{0,1\}\([^"]*\)"\{0,1\}$/args:\1/p'
  elif [ -r /etc/kernel/cmdline ]; then
    printf 'source:/etc/kernel/cmdline\nargs:'; cat /etc/kernel/cmdline
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
  printf 'symlink:%s\n' "$(readlink -f /usr/local/cuda 2>/dev/null)"
  for t in /usr/local/cuda-*; do [ -d "$t" ] && printf 'toolkit:%s\n' "$t"; done
  [ -x /usr/local/cuda/bin/nvcc ] && printf 'symlink-nvcc:%s\n' "$(/usr/local/cuda/bin/nvcc --version | tail -n 2 | tr '\n' ' ')"
  env -i HOME=/root PATH=/usr/bin:/bin TERM=dumb sh -lc \
    'printf "path:%s\nld:%s\nnvcc:%s\n" "$PATH" "$LD_LIBRARY_PATH" "$(command -v nvcc)"; nvcc --version 2>/dev/null | tail -n 2 | sed "s/^/nvcc-version:/"' < /dev/null
}

packages() {
  if [ -r /var/lib/dpkg/status ]; then
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
      if (s ~ / installed$/ && p ~ /^(nvidia|libnvidia|cuda|libcuda|datacenter-gpu|irqbalance|numactl)/)
        printf "pkg:%s\t%s\t%s\n", p, v, (s ~ /^hold/ ? "hi" : "ii")
      if (s ~ /^hold/) print "held:" p
    }' /var/lib/dpkg/status
  elif command -v rpm >/dev/null; then
    printf 'manager:dnf\n'
    rpm -qa --qf 'pkg:%{NAME}\t%{VERSION}-%{RELEASE}\tii\n' | grep -E '^pkg:(nvidia|libnvidia|cuda|libcuda|kmod-nvidia|datacenter-gpu|irqbalance|numactl)'
    grep -hs . /etc/dnf/plugins/versionlock.list /etc/yum/pluginconf.d/versionlock.list | sed 's/^/lock:/'
  fi
  return 0
}

services() {
  u="irqbalance nvidia-persistenced hosttune-irq-affinity hosttune-cpu-governor hosttune-thp"
  printf 'running:'; for p in /proc/[0-9]*/comm; do read -r c < "$p" 2>/dev/null && printf '%s ' "$c"; done; printf '\n'
  [ "$(cat /proc/1/comm)" = systemd ] || return 0
  for x in $u; do set -- "$@" "$x.service"; done
  systemctl show --property=Id,LoadState,ActiveState,UnitFileState "$@" | sed 's/^/unit:/'
  return 0
}

system() {
  grep -sH '' /sys/devices/system/cpu/online /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor \
    /sys/devices/system/cpu/cpuidle/current_driver /sys/module/intel_idle/parameters/max_cstate \
    /sys/devices/system/cpu/cpu0/cpuidle/state*/name /sys/devices/system/cpu/cpu0/cpuidle/state*/disable \
    /sys/devices/system/cpu/cpu0/cpuidle/state*/latency /sys/devices/system/node/node*/cpulist \
    /proc/sys/kernel/numa_balancing /sys/kernel/mm/transparent_hugepage/enabled \
    /sys/module/nvme_core/parameters/default_ps_max_latency_us /sys/class/nvme/nvme*/model \
    /sys/class/nvme/nvme*/device/power_state /proc/driver/nvidia/version \
    /etc/default/hosttune-thp
  ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/aarch64-linux-gnu/libnvidia-ml.so.* 2>/dev/null | sed 's/^/nvml-lib:/'
  return 0
}

sysctl_conf() {
  grep -sH 'numa_balancing' /etc/sysctl.conf /etc/sysctl.d/*.conf /run/sysctl.d/*.conf /usr/local/lib/sysctl.d/*.conf /usr/lib/sysctl.d/*.conf /lib/sysctl.d/*.conf
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
# A deployed engine or its nginx front: does it answer without a key? (an interpreter only where one is)
if [ -e /opt/hosttune/current ] || [ -n "$(ls /etc/nginx/conf.d/hosttune-*.conf 2>/dev/null)" ]; then
  command -v python3 >/dev/null && sec engine-access python3 -c "$HOSTTUNE_ACCESS_PROBE"
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
  sec smi-xml nvidia-smi -q -x
  sec smi-csv nvidia-smi --query-gpu=index,name,pci.bus_id,pstate,persistence_mode,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version,compute_cap --format=csv
fi
exit 0
