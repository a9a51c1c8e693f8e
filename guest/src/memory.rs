//! Memory calls: allocations, the pinned pool, copies and memsets.

use protocol::Request;
use transport::FLAG_MORE;

use crate::numbering::Waited;
use crate::{DevPtr, Gpu, GuestError, Result};

impl Gpu {
    /// cuMemAlloc.
    pub fn mem_alloc(&mut self, size: u64) -> Result<DevPtr> {
        Ok(self.call(&Request::MemAlloc { size })?.vals[0])
    }

    /// cuMemFree.
    pub fn mem_free(&mut self, ptr: DevPtr) -> Result<()> {
        self.call(&Request::MemFree { ptr }).map(drop)
    }

    /// cuMemFreeAsync: frees once the work submitted to `stream` so far is
    /// done (asynchronous; an error comes at the next synchronizing call).
    pub fn mem_free_async(&mut self, ptr: DevPtr, stream: u64) -> Result<()> {
        self.send(&Request::MemFreeAsync { ptr, stream }, &[])
            .map(drop)
    }

    /// Pinned memory from the region's pool: its offset in the pool.
    pub fn pinned_alloc(&mut self, size: u64) -> Result<u64> {
        Ok(self.call(&Request::PinnedAlloc { size })?.vals[0])
    }

    /// Gives pinned memory back.
    pub fn pinned_free(&mut self, offset: u64) -> Result<()> {
        self.call(&Request::PinnedFree { offset }).map(drop)
    }

    /// Copies `len` bytes of pinned memory at pool offset `offset` to the
    /// device, when `stream` gets there (DMA; returns at once).
    pub fn memcpy_htod_pinned(
        &mut self,
        dst: DevPtr,
        offset: u64,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyHtoDPinned {
                dst,
                offset,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// Copies device bytes to pinned memory at pool offset `offset` when
    /// `stream` gets there (DMA; returns at once).
    pub fn memcpy_dtoh_pinned(
        &mut self,
        src: DevPtr,
        offset: u64,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyDtoHPinned {
                src,
                offset,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// The shared region this connection uses.
    pub fn region(&self) -> &transport::Region {
        self.ch.region()
    }

    /// cuMemGetInfo: (free, total) of this vGPU.
    pub fn mem_get_info(&mut self) -> Result<(u64, u64)> {
        let r = self.call(&Request::MemGetInfo)?;
        Ok((r.vals[0], r.vals[1]))
    }

    /// cuMemcpyHtoDAsync: enqueues the copy; returns once the bytes are in the ring.
    pub fn memcpy_htod_async(&mut self, dst: DevPtr, src: &[u8], stream: u64) -> Result<()> {
        self.send(
            &Request::MemcpyHtoD {
                dst,
                len: src.len() as u64,
                stream,
            },
            src,
        )
        .map(drop)
    }

    /// cuMemcpyHtoD: copy and wait for completion.
    pub fn memcpy_htod(&mut self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.memcpy_htod_async(dst, src, 0)?;
        self.stream_synchronize(0)
    }

    /// cuMemcpyDtoH: synchronous; streams the bytes back through the arena.
    pub fn memcpy_dtoh(&mut self, dst: &mut [u8], src: DevPtr, stream: u64) -> Result<()> {
        let len = dst.len();
        let tag = self.send(
            &Request::MemcpyDtoH {
                src,
                len: len as u64,
                stream,
            },
            &[],
        )?;
        let mut off = 0;
        loop {
            let d = self.wait_reply(tag)?;
            let n = d.data_len as usize;
            if d.status == 0 && off + n > len {
                self.ch.resp.consume(&d)?;
                return Err(GuestError::Protocol(format!(
                    "host sent {} bytes for a {len}-byte copy",
                    off + n
                )));
            }
            if d.status == 0 {
                // One copy, straight from the arena into the caller's buffer.
                self.copier
                    .copy_out(&self.ch.resp.data(&d)?, &mut dst[off..off + n]);
            }
            self.ch.resp.consume(&d)?;
            Self::status(&d)?;
            off += n;
            if d.flags & FLAG_MORE == 0 {
                self.take_output(&d)?;
                break;
            }
        }
        if off != len {
            return Err(GuestError::Protocol(format!(
                "host sent {off} of {len} bytes"
            )));
        }
        // The copy came after all the stream's earlier work.
        self.seq.waited(tag, Waited::Stream(stream));
        Ok(())
    }

    /// cuMemcpyDtoDAsync.
    pub fn memcpy_dtod_async(
        &mut self,
        dst: DevPtr,
        src: DevPtr,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyDtoD {
                dst,
                src,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// cuMemsetD8/D16/D32Async.
    pub fn memset_async(
        &mut self,
        dst: DevPtr,
        value: u32,
        width: u32,
        count: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::Memset {
                dst,
                value,
                width,
                count,
                stream,
            },
            &[],
        )
        .map(drop)
    }
}
