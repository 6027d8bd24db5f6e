#!/bin/sh
# Makes mmdebstrap's tree ($1) the appliance, with the files in $2 (config/image/).
# Run by `cargo xtask image` as mmdebstrap's customize hook, on the build host, as root.
set -eu
tree=$1
files=$2

echo cyphonic > "$tree/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tcyphonic\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    > "$tree/etc/hosts"
# The boot partition holds the operator's files, keys among them until the first boot
# takes them: root only.
cat > "$tree/etc/fstab" <<FSTAB
LABEL=RASPIROOT /              ext4 rw,noatime,errors=remount-ro 0 1
LABEL=RASPIFIRM /boot/firmware vfat rw,noatime,umask=0077 0 2
FSTAB

# The boot partition's config.txt and cmdline.txt, written again by raspi-firmware's kernel
# hook with what a chroot cannot find out: the root file system by its label, the Pi 4's
# serial console (ttyS1) and screen, and no cma= (which keeps a Pi 4 from booting).
cat >> "$tree/etc/default/raspi-firmware" <<DEFAULTS

# cyphonic image (config/image/customize.sh)
ROOTPART=LABEL=RASPIROOT
CONSOLES="tty0 ttyS1,115200"
CMA=0
DEFAULTS
# The hook writes only into a mounted /boot/firmware (it looks through /proc).
mounted_proc=
if ! mountpoint -q "$tree/proc"; then
    mount -t proc proc "$tree/proc"
    mounted_proc=yes
fi
mount --bind "$tree/boot/firmware" "$tree/boot/firmware"
status=0
chroot "$tree" env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware || status=$?
umount "$tree/boot/firmware"
[ -z "$mounted_proc" ] || umount "$tree/proc"
[ "$status" = 0 ] || exit "$status"
grep -q 'root=LABEL=RASPIROOT' "$tree/boot/firmware/cmdline.txt"

# The network: the uplink by networkd, the LAN port left to the adapter.
install -m 0644 "$files/10-uplink.network" "$files/20-lan.network" "$tree/etc/systemd/network/"
chroot "$tree" systemctl enable systemd-networkd.service systemd-timesyncd.service

# No passwords anywhere; SSH only once the boot partition brings authorized_keys.
chroot "$tree" passwd -l root
chroot "$tree" systemctl disable ssh.service
rm -f "$tree"/etc/ssh/ssh_host_*
# Host keys are made on the appliance, not copied onto every card.
cat > "$tree/etc/systemd/system/ssh-hostkeys.service" <<UNIT
[Unit]
Description=SSH host keys for this appliance
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
RequiredBy=ssh.service
UNIT
chroot "$tree" systemctl enable ssh-hostkeys.service
cat > "$tree/etc/ssh/sshd_config.d/cyphonic.conf" <<SSHD
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SSHD

# The first-boot step, and the adapter after it.
install -d "$tree/usr/lib/cyphonic"
install -m 0755 "$files/firstboot" "$tree/usr/lib/cyphonic/firstboot"
install -m 0644 "$files/cyphonic-firstboot.service" "$tree/etc/systemd/system/"
chroot "$tree" systemctl enable cyphonic-firstboot.service cyphonic-adapter.service

# The machine's identity is made at its first boot.
: > "$tree/etc/machine-id"
rm -f "$tree/var/lib/dbus/machine-id"
# No package lists on the card (apt-get update brings them).
rm -rf "$tree"/var/lib/apt/lists/*
rm -rf "$tree"/var/cache/apt/*.bin
