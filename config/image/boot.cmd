# cyphonic: U-Boot's boot script (boot.scr on the boot partition, made by `cargo xtask
# image` with mkimage). Two root slots, A (partition 2) and B (partition 3), chosen by
# RAUC's U-Boot scheme: BOOT_ORDER lists the slots, first preferred; BOOT_<slot>_LEFT is
# how many more boots a slot may try. Each boot takes one from the slot it boots; Linux
# gives them back once the slot proves well (cyphonic-slot-check, `rauc status
# mark-good`), and RAUC puts a freshly written slot first with one try. A slot with none
# left is passed over: a bad update falls back to the slot that worked, by itself.
#
# The counters live in cyphonic.env on this partition (16 KiB, U-Boot's own format with
# its CRC), which Linux reads and writes with fw_printenv/fw_setenv (/etc/fw_env.config).
# Optional extra kernel arguments: a line `extraargs=...` in cyphonic/boot.conf.

setenv cy_boot ${devtype} ${devnum}:${distro_bootpart}
setenv BOOT_ORDER
setenv BOOT_A_LEFT
setenv BOOT_B_LEFT
if load ${cy_boot} ${kernel_addr_r} cyphonic.env; then
    env import -c ${kernel_addr_r} 0x4000 BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fi
test -n "${BOOT_ORDER}" || setenv BOOT_ORDER "A"
test -n "${BOOT_A_LEFT}" || setenv BOOT_A_LEFT 3
test -n "${BOOT_B_LEFT}" || setenv BOOT_B_LEFT 0

setenv cy_slot
for s in ${BOOT_ORDER}; do
    if test -z "${cy_slot}"; then
        if test "${s}" = "A"; then
            if test ${BOOT_A_LEFT} -gt 0; then
                setexpr BOOT_A_LEFT ${BOOT_A_LEFT} - 1
                setenv cy_slot A
                setenv cy_part 2
            else
                echo "cyphonic: slot A has no tries left, passed over"
            fi
        fi
        if test "${s}" = "B"; then
            if test ${BOOT_B_LEFT} -gt 0; then
                setexpr BOOT_B_LEFT ${BOOT_B_LEFT} - 1
                setenv cy_slot B
                setenv cy_part 3
            else
                echo "cyphonic: slot B has no tries left, passed over"
            fi
        fi
    fi
done

if test -z "${cy_slot}"; then
    # Every slot used its tries (power cuts in a row, say): each slot in the order gets
    # three again, and the board starts over.
    echo "cyphonic: no slot has tries left: three each again, and a reset"
    for s in ${BOOT_ORDER}; do
        if test "${s}" = "A"; then setenv BOOT_A_LEFT 3; fi
        if test "${s}" = "B"; then setenv BOOT_B_LEFT 3; fi
    done
fi

env export -c -s 0x4000 ${kernel_addr_r} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fatwrite ${cy_boot} ${kernel_addr_r} cyphonic.env 0x4000
if test -z "${cy_slot}"; then
    reset
fi
echo "cyphonic: booting slot ${cy_slot} (BOOT_ORDER ${BOOT_ORDER}, A ${BOOT_A_LEFT} left, B ${BOOT_B_LEFT} left)"

# The kernel's console: the Pi 4's serial port and screen, or the first PL011 elsewhere
# (QEMU's virt machine).
if test "${board}" = "rpi"; then
    setenv cy_console "console=tty0 console=ttyS1,115200"
else
    setenv cy_console "console=ttyAMA0"
fi
setenv extraargs
if load ${cy_boot} ${kernel_addr_r} cyphonic/boot.conf; then
    env import -t ${kernel_addr_r} ${filesize} extraargs
fi

setenv cy_root ${devtype} ${devnum}:${cy_part}
part uuid ${cy_root} cy_uuid
# A gzipped kernel is unpacked by booti through kernel_comp_addr_r (Debian's arm64 kernel
# is not, today). The initrd goes 64 MiB above the kernel, clear of its image.
setexpr cy_initrd ${kernel_addr_r} + 0x4000000
setexpr kernel_comp_addr_r ${kernel_addr_r} + 0x6000000
load ${cy_root} ${kernel_addr_r} /vmlinuz
setenv kernel_comp_size ${filesize}
load ${cy_root} ${cy_initrd} /initrd.img
setenv bootargs "${cy_console} root=PARTUUID=${cy_uuid} rootfstype=ext4 rootflags=noatime rw rootwait fsck.repair=yes net.ifnames=0 rauc.slot=${cy_slot} ${extraargs}"
booti ${kernel_addr_r} ${cy_initrd}:${filesize} ${fdt_addr}
echo "cyphonic: slot ${cy_slot} did not boot; starting over"
reset
