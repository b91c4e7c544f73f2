//! `--steer cpu`: a classic-BPF reuseport program (SO_ATTACH_REUSEPORT_CBPF, socket(7))
//! that hands each datagram to the socket of the shard running on the CPU that is
//! processing the packet — the NIC RSS queue's CPU when the host pins one queue per
//! core (docs/operations.md). CPUs without a shard fall back to `cpu mod shards`.
//!
//! The program returns an index into the reuseport group, whose order is the bind
//! order: shard i's socket is index i (crate::dataplane::socket::bind_all binds shard by shard).

use crate::dataplane::socket::UdpSock;
use anyhow::{bail, Context, Result};
use std::os::fd::AsRawFd;
use sys::cvt;

// linux/filter.h
const BPF_LD: u16 = 0x00;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_ALU: u16 = 0x04;
const BPF_MOD: u16 = 0x90;
const BPF_JMP: u16 = 0x05;
const BPF_JEQ: u16 = 0x10;
const BPF_K: u16 = 0x00;
const BPF_RET: u16 = 0x06;
const BPF_A: u16 = 0x10;
/// Ancillary data area of classic BPF (SKF_AD_OFF) and its CPU field (SKF_AD_CPU).
const SKF_AD_OFF: i32 = -0x1000;
const SKF_AD_CPU: i32 = 36;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program for shards on `cores` (shard i on cores[i]).
pub fn program(cores: &[usize]) -> Result<Vec<libc::sock_filter>> {
    let n = cores.len();
    if n == 0 || n > 250 {
        bail!("--steer cpu supports 1..=250 shards");
    }
    let mut p = Vec::with_capacity(2 * n + 3);
    // A = the current CPU.
    p.push(ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, (SKF_AD_OFF + SKF_AD_CPU) as u32));
    // if A == cores[i] goto ret_i  (ret_i sits n + 1 instructions past each jump)
    for &c in cores {
        p.push(ins(BPF_JMP | BPF_JEQ | BPF_K, (n + 1) as u8, 0, c as u32));
    }
    // Unknown CPU: A mod n.
    p.push(ins(BPF_ALU | BPF_MOD | BPF_K, 0, 0, n as u32));
    p.push(ins(BPF_RET | BPF_A, 0, 0, 0));
    for i in 0..n {
        p.push(ins(BPF_RET | BPF_K, 0, 0, i as u32));
    }
    Ok(p)
}

/// Attaches the program to the first socket of every listen address's group.
pub fn attach_cpu_steering(sockets: &[Vec<UdpSock>], cores: &[core_affinity::CoreId]) -> Result<()> {
    let ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
    let prog = program(&ids)?;
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    let Some(first) = sockets.first() else { return Ok(()) };
    for s in first {
        // SAFETY: fprog points to `prog`, alive for the call; the kernel copies it.
        cvt(unsafe {
            libc::setsockopt(
                s.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_REUSEPORT_CBPF,
                (&fprog as *const libc::sock_fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        })
        .with_context(|| format!("SO_ATTACH_REUSEPORT_CBPF on {}", s.local))?;
    }
    tracing::info!(cores = ?ids, "reuseport CPU steering attached");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_shape() {
        let p = program(&[0, 2]).unwrap();
        assert_eq!(p.len(), 1 + 2 + 2 + 2);
        // jump from index 1 lands on ret #0 at index 5; from 2 on ret #1 at 6.
        assert_eq!(1 + 1 + usize::from(p[1].jt), 5);
        assert_eq!(p[5].k, 0);
        assert_eq!(2 + 1 + usize::from(p[2].jt), 6);
        assert_eq!(p[6].k, 1);
        assert!(program(&[]).is_err());
    }
}
