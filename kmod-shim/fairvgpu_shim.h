/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * fairvgpu guest shim: the user-space interface of /dev/fairvgpuN.
 *
 * One character device per ivshmem-doorbell PCI device (1af4:1110), that is
 * one per vGPU attached to the VM.
 *
 *   mmap    maps the shared region (BAR2) at offset 0, write-back cached.
 *   ioctl   FVGPU_IOC_INFO      what the device is (region size, our peer id,
 *                               interrupt vectors, counters).
 *           FVGPU_IOC_RING      rings a peer's doorbell: (peer << 16) | vector.
 *           FVGPU_IOC_SET_VECTOR  the doorbell vector this file waits on.
 *           FVGPU_IOC_WAIT      blocks until an interrupt on that vector that
 *                               this file has not consumed, or the timeout.
 *                               Returns 1 when woken by an interrupt, 0 on
 *                               timeout.
 *           FVGPU_IOC_BIND      this file holds channel N of generation G: if
 *                               the file is released while the channel is
 *                               still claimed, the module marks the channel
 *                               abandoned and rings the host.
 *           FVGPU_IOC_UNBIND    the channel was let go cleanly.
 *   poll/read  the same wait as FVGPU_IOC_WAIT, for event loops: POLLIN when an
 *              interrupt is pending; read() returns the vector's u64 count.
 *
 * Rust's copy of these numbers lives in guest/src/device.rs; a test
 * there checks that both agree.
 */
#ifndef FAIRVGPU_SHIM_H
#define FAIRVGPU_SHIM_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <stdint.h>
#include <sys/ioctl.h>
#define __u32 uint32_t
#define __u64 uint64_t
#endif

#define FVGPU_IOC_MAGIC 'F'

struct fvgpu_info {
	__u64 region_size; /* BAR2 bytes */
	__u32 peer_id; /* our ivshmem peer id (IVPosition) */
	__u32 vectors; /* MSI-X vectors in use (0: none, polling only) */
	__u64 interrupts; /* doorbell interrupts received, all vectors */
	__u64 wakeups; /* waiters that slept and were woken by one */
};

struct fvgpu_wait {
	__u64 timeout_us; /* longest block */
};

struct fvgpu_bind {
	__u32 channel;
	__u32 generation;
};

#define FVGPU_IOC_INFO _IOR(FVGPU_IOC_MAGIC, 1, struct fvgpu_info)
#define FVGPU_IOC_RING _IOW(FVGPU_IOC_MAGIC, 2, __u32)
#define FVGPU_IOC_SET_VECTOR _IOW(FVGPU_IOC_MAGIC, 3, __u32)
#define FVGPU_IOC_WAIT _IOW(FVGPU_IOC_MAGIC, 4, struct fvgpu_wait)
#define FVGPU_IOC_BIND _IOW(FVGPU_IOC_MAGIC, 5, struct fvgpu_bind)
#define FVGPU_IOC_UNBIND _IOW(FVGPU_IOC_MAGIC, 6, __u32)

#endif
