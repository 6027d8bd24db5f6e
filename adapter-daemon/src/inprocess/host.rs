//! A device with a TCP/IP stack (smoltcp over IP; the Ethernet header wrapped and
//! unwrapped here with the device's and its gateway's MACs), on its wires.

use super::*;

/// A device with a TCP/IP stack, on its wires.
pub(super) struct Host {
    device: Device,
    gw_mac: [u8; 6],
    pub(super) iface: smoltcp::iface::Interface,
    queues: Queues,
    pub(super) sockets: smoltcp::iface::SocketSet<'static>,
    started: Instant,
}

/// The packets between a [`Host`]'s stack and its wires.
#[derive(Default)]
struct Queues {
    rx: std::collections::VecDeque<Vec<u8>>,
    tx: std::collections::VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);

struct Tx<'a>(&'a mut std::collections::VecDeque<Vec<u8>>);

impl smoltcp::phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

impl smoltcp::phy::Device for Queues {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((Rx(packet), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> smoltcp::phy::DeviceCapabilities {
        let mut caps = smoltcp::phy::DeviceCapabilities::default();
        caps.medium = smoltcp::phy::Medium::Ip;
        caps.max_transmission_unit = 1500;
        caps
    }
}

impl Host {
    /// `device`, leased at `ip` behind the gateway at `gw_mac`, with a stack: every overlay
    /// address on its link (the gateway's MAC takes them all).
    pub(super) fn new(device: Device, ip: Ipv4Addr, gw_mac: [u8; 6]) -> Self {
        use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};
        for wire in &device.wires {
            wire.set_nonblocking(true).expect("non-blocking");
        }
        let mut queues = Queues::default();
        let config = smoltcp::iface::Config::new(HardwareAddress::Ip);
        let mut iface =
            smoltcp::iface::Interface::new(config, &mut queues, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|ips| {
            let _ = ips.push(IpCidr::new(IpAddress::Ipv4(ip), 10));
        });
        Self {
            device,
            gw_mac,
            iface,
            queues,
            sockets: smoltcp::iface::SocketSet::new(Vec::new()),
            started: Instant::now(),
        }
    }

    /// A TCP socket with 64-KiB buffers each way.
    pub(super) fn tcp(&mut self) -> smoltcp::iface::SocketHandle {
        use smoltcp::socket::tcp;
        let buffer = || tcp::SocketBuffer::new(vec![0; 65_536]);
        self.sockets.add(tcp::Socket::new(buffer(), buffer()))
    }

    pub(super) fn socket(
        &mut self,
        h: smoltcp::iface::SocketHandle,
    ) -> &mut smoltcp::socket::tcp::Socket<'static> {
        self.sockets
            .get_mut::<smoltcp::socket::tcp::Socket<'static>>(h)
    }

    /// Frames in (those for its MAC, unwrapped), the stack run, packets out (wrapped).
    pub(super) fn pump(&mut self) {
        let mut buf = vec![0u8; 65_536];
        for wire in &self.device.wires {
            while let Ok(n) = wire.recv(&mut buf) {
                let frame = &buf[..n];
                if frame[..6] == self.device.mac && ipv4(frame).is_some() {
                    self.queues.rx.push_back(frame[IP..].to_vec());
                }
            }
        }
        let now = smoltcp::time::Instant::from_micros(
            i64::try_from(self.started.elapsed().as_micros()).unwrap_or(i64::MAX),
        );
        self.iface.poll(now, &mut self.queues, &mut self.sockets);
        while let Some(packet) = self.queues.tx.pop_front() {
            self.device
                .send(&eth(self.gw_mac, self.device.mac, &packet));
        }
    }
}
