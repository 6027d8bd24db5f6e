//! Classic BPF programs, the few instructions the kernel runs to steer a packet to one of a
//! group of sockets (`SO_ATTACH_REUSEPORT_CBPF`) or to let a socket queue only some frames
//! (`SO_ATTACH_FILTER`). Classic, not eBPF: no `bpf()` system call, no
//! privilege, no verifier-dependent kernel feature; the kernel checks the program when it is
//! attached. The caller writes the program (netio knows no packet format); these are
//! `linux/filter.h`'s encodings.

/// One instruction, the fields of `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl Insn {
    const fn raw(self) -> libc::sock_filter {
        libc::sock_filter {
            code: self.code,
            jt: self.jt,
            jf: self.jf,
            k: self.k,
        }
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "linux/filter.h's opcodes are 16-bit values"
)]
const fn insn(code: u32, jt: u8, jf: u8, k: u32) -> Insn {
    Insn {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// `ldb [k]`: the accumulator takes the byte at offset `k` (of the payload the program sees).
/// A program that loads past the packet's end returns 0 there and then.
pub const fn load_byte(k: u32) -> Insn {
    insn(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, k)
}

/// `ldh [k]`: the accumulator takes the big-endian 16-bit value at offset `k`.
pub const fn load_half(k: u32) -> Insn {
    insn(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0, 0, k)
}

/// `ldh [x + k]`: the accumulator takes the big-endian 16-bit value at offset `x + k`.
pub const fn load_half_at_x(k: u32) -> Insn {
    insn(libc::BPF_LD | libc::BPF_H | libc::BPF_IND, 0, 0, k)
}

/// `ldxb 4*([k]&0xf)`: the index register takes four times the low nibble of the byte at
/// `k` (an IPv4 header's length, from its first byte).
pub const fn load_x_ipv4_header_len(k: u32) -> Insn {
    insn(libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH, 0, 0, k)
}

/// `ld #len`: the accumulator takes the packet's length.
pub const fn load_len() -> Insn {
    insn(libc::BPF_LD | libc::BPF_W | libc::BPF_LEN, 0, 0, 0)
}

/// `sub #k`: the accumulator less `k` (wrapping).
pub const fn sub(k: u32) -> Insn {
    insn(libc::BPF_ALU | libc::BPF_SUB | libc::BPF_K, 0, 0, k)
}

/// `jge #k, jt, jf`: skips `jt` instructions if the accumulator is at least `k`, else `jf`.
pub const fn jump_ge(k: u32, jt: u8, jf: u8) -> Insn {
    insn(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, jt, jf, k)
}

/// `jge x, jt, jf`: skips `jt` instructions if the accumulator is at least the index
/// register, else `jf`.
pub const fn jump_ge_x(jt: u8, jf: u8) -> Insn {
    insn(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_X, jt, jf, 0)
}

/// `jeq #k, jt, jf`: skips `jt` instructions if the accumulator equals `k`, else `jf`.
pub const fn jump_eq(k: u32, jt: u8, jf: u8) -> Insn {
    insn(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, jt, jf, k)
}

/// `jset #k, jt, jf`: skips `jt` instructions if the accumulator has a bit of `k` set, else
/// `jf`.
pub const fn jump_set(k: u32, jt: u8, jf: u8) -> Insn {
    insn(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, jt, jf, k)
}

/// `ret #k`: the program's answer (for a socket group, the index of the socket).
pub const fn ret(k: u32) -> Insn {
    insn(libc::BPF_RET | libc::BPF_K, 0, 0, k)
}

/// `ld #cpu`: the accumulator takes the number of the CPU the kernel runs the program on
/// (the one that received the packet: its interrupt's, or its sender's on a virtual link).
pub const fn load_cpu() -> Insn {
    #[expect(
        clippy::cast_sign_loss,
        reason = "linux/filter.h's ancillary offsets are negative offsets, as the kernel reads k"
    )]
    let k = (libc::SKF_AD_OFF + libc::SKF_AD_CPU) as u32;
    insn(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, k)
}

/// The tail of a program that answers by the CPU it runs on: `answer(i)` on `cpus[i]`, and
/// `answer(0)` on a CPU not listed (or when `cpus` is empty). For a group of sockets each
/// read by a thread on one CPU (`cpus[i]`'s socket is `i`): a packet is then queued where
/// its reader runs, and waking that reader never takes a message to another core.
pub fn by_cpu(cpus: &[usize], answer: impl Fn(usize) -> u32) -> Vec<Insn> {
    let mut program = vec![load_cpu()];
    for (i, &cpu) in cpus.iter().enumerate() {
        let cpu = u32::try_from(cpu).unwrap_or(u32::MAX);
        program.extend([jump_eq(cpu, 0, 1), ret(answer(i))]);
    }
    program.push(ret(answer(0)));
    program
}

/// Attaches `program` to socket `fd` as socket option `name` (`SO_ATTACH_FILTER`,
/// `SO_ATTACH_REUSEPORT_CBPF`); the kernel checks it there.
///
/// # Errors
/// An empty program or one over 4096 instructions (`EINVAL`), or the kernel's refusal.
pub(crate) fn attach(fd: libc::c_int, name: libc::c_int, program: &[Insn]) -> std::io::Result<()> {
    let mut insns: Vec<libc::sock_filter> = program.iter().map(|i| i.raw()).collect();
    let len = u16::try_from(insns.len())
        .ok()
        .filter(|l| (1..=4096).contains(l))
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog {
        len,
        filter: insns.as_mut_ptr(),
    };
    crate::sys::setsockopt(fd, libc::SOL_SOCKET, name, &fprog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `program`'s jumps and returns (a program of loads, jumps and returns only) on a
    /// packet received on `cpu`.
    fn run_on(program: &[Insn], cpu: u32) -> u32 {
        let (mut pc, mut acc) = (0, 0);
        loop {
            let i = program[pc];
            match u32::from(i.code) {
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => acc = cpu,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if acc == i.k { i.jt } else { i.jf });
                }
                c => panic!("no such instruction in these programs: {c:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn by_cpu_answers_each_listed_cpu_its_own_and_the_rest_the_first() {
        let program = by_cpu(&[2, 5, 3], |i| 10 + u32::try_from(i).unwrap());
        assert_eq!(program[0], load_cpu());
        let answers: Vec<u32> = (0..7).map(|cpu| run_on(&program, cpu)).collect();
        assert_eq!(answers, [10, 10, 10, 12, 10, 11, 10]);
        // No CPUs: the one answer.
        assert_eq!(
            run_on(&by_cpu(&[], |i| u32::try_from(i).unwrap() + 1), 4),
            1
        );
    }

    #[test]
    fn instructions_encode_as_linux_filter_h_does() {
        // From `tcpdump -dd` and linux/filter.h: ldb [1] = 0x30, ldh [2] = 0x28, jeq = 0x15,
        // jset = 0x45, ret #k = 0x06.
        assert_eq!(load_byte(1).code, 0x30);
        assert_eq!(load_half(2).code, 0x28);
        let j = jump_eq(3, 1, 2);
        assert_eq!((j.code, j.jt, j.jf, j.k), (0x15, 1, 2, 3));
        assert_eq!(jump_set(2, 0, 1).code, 0x45);
        // ldh [x + 14] = 0x48, ldxb 4*([14]&0xf) = 0xb1.
        assert_eq!((load_half_at_x(14).code, load_half_at_x(14).k), (0x48, 14));
        assert_eq!(load_x_ipv4_header_len(14).code, 0xb1);
        // ld #len = 0x80, sub #k = 0x14, jge #k = 0x35, jge x = 0x3d.
        assert_eq!(load_len().code, 0x80);
        assert_eq!((sub(18).code, sub(18).k), (0x14, 18));
        assert_eq!(jump_ge(34, 0, 1).code, 0x35);
        assert_eq!(jump_ge_x(0, 1).code, 0x3d);
        assert_eq!((ret(7).code, ret(7).k), (0x06, 7));
        // ld #cpu = ld [SKF_AD_OFF + SKF_AD_CPU] = 0x20, k 0xfffff024.
        assert_eq!((load_cpu().code, load_cpu().k), (0x20, 0xffff_f024));
        assert!(
            attach(-1, libc::SO_ATTACH_FILTER, &[]).is_err(),
            "an empty program"
        );
    }
}
