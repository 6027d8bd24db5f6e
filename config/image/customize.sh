#!/bin/sh
# Makes mmdebstrap's tree ($1) the appliance, with the files in $2 (config/image/), the
# image's MBR disk identifier $3 (8 hex digits) and the bundle certificate $4 (PEM).
# Run by `cargo xtask image` as mmdebstrap's customize hook, on the build host, as root.
set -eu
tree=$1
files=$2
disk_id=$3
bundle_cert=$4

echo cyphonic > "$tree/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tcyphonic\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    > "$tree/etc/hosts"
# The boot partition holds the operator's files, keys among them until the first boot
# takes them: root only. The root is the slot U-Boot booted (root= on its command line):
# both slots carry the same file system, label and all, so none is named here.
cat > "$tree/etc/fstab" <<FSTAB
LABEL=RASPIFIRM /boot/firmware vfat rw,noatime,umask=0077 0 2
FSTAB

# raspi-firmware's kernel hook puts the device trees on the boot partition (with a
# kernel, initrd, config.txt and cmdline.txt, which U-Boot's A/B boot replaces below).
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
test -e "$tree/boot/firmware/bcm2711-rpi-4-b.dtb"

# The Pi's firmware starts U-Boot, whose script boots one of two root slots
# (config/image/boot.cmd): the kernel and initrd come from the slot, not from here.
firmware=$tree/boot/firmware
rm -f "$firmware"/vmlinuz-* "$firmware"/initrd.img-* "$firmware/cmdline.txt"
# From now on the hook would write a kernel and config.txt into the shared boot partition
# behind U-Boot's back: each slot's kernel stays in the slot.
for hook in "$tree/etc/kernel/postinst.d/z50-raspi-firmware" \
    "$tree/etc/initramfs/post-update.d/z50-raspi-firmware"; do
    printf '#!/bin/sh\n# cyphonic image: U-Boot boots the kernel of each root slot from the\n# slot itself (/boot/firmware/boot.scr); nothing to copy.\nexit 0\n' > "$hook"
done
cat > "$firmware/config.txt" <<CONFIG
# cyphonic image: the firmware starts U-Boot (u-boot-rpi), which boots root slot A or B
# by boot.scr. No kernel or command line here: each slot has its own.
arm_64bit=1
enable_uart=1
upstream_kernel=1
kernel=u-boot.bin
CONFIG
cp "$tree/usr/lib/u-boot/rpi_arm64/u-boot.bin" "$firmware/u-boot.bin"
mkimage -A arm64 -O linux -T script -C none -n "cyphonic A/B" \
    -d "$files/boot.cmd" "$firmware/boot.scr" >/dev/null
# The boot counters: slot A, three tries; B empty until an update writes it.
printf 'BOOT_ORDER=A\nBOOT_A_LEFT=3\nBOOT_B_LEFT=0\n' |
    mkenvimage -s 0x4000 -o "$firmware/cyphonic.env" -
install -m 0644 "$files/fw_env.config" "$tree/etc/fw_env.config"

# RAUC: the two slots, the keyring that bundles must be signed for, and the check that
# keeps a slot or rolls it back.
install -d "$tree/etc/rauc"
sed "s/@DISK_ID@/$disk_id/g" "$files/rauc/system.conf" > "$tree/etc/rauc/system.conf"
install -m 0644 "$bundle_cert" "$tree/etc/rauc/keyring.pem"

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
install -m 0755 "$files/slot-check" "$tree/usr/lib/cyphonic/slot-check"
install -m 0644 "$files/cyphonic-firstboot.service" "$files/cyphonic-slot-check.service" \
    "$tree/etc/systemd/system/"
chroot "$tree" systemctl enable cyphonic-firstboot.service cyphonic-adapter.service \
    cyphonic-slot-check.service

# The machine's identity is made at its first boot.
: > "$tree/etc/machine-id"
rm -f "$tree/var/lib/dbus/machine-id"
# No package lists on the card (apt-get update brings them).
rm -rf "$tree"/var/lib/apt/lists/*
rm -rf "$tree"/var/cache/apt/*.bin
