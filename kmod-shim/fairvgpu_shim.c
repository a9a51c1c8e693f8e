// SPDX-License-Identifier: GPL-2.0
/*
 * fairvgpu guest shim: binds QEMU's ivshmem-doorbell PCI device (1af4:1110)
 * and gives user space what the guest library needs and nothing more:
 *
 *  - the shared region (BAR2) mapped into the process, so that requests and
 *    replies cross the VM boundary with no system call and no VM exit;
 *  - blocking on MSI-X doorbell interrupts once the library's spin budget is
 *    spent (vector k is affine to vCPU k, so the host's kick lands on the
 *    vCPU the waiter runs on);
 *  - ringing the host's doorbell (a write to BAR0's Doorbell register);
 *  - telling the host when a process dies holding a channel: the channel is
 *    marked abandoned in the region and the host is rung, so its context and
 *    device memory are freed at once.
 *
 * The region is written by the host and by every process of this VM, so
 * everything read from it here (the header, channel words) is validated
 * before use. See fairvgpu_shim.h for the user-space interface.
 */

#include <linux/atomic.h>
#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/kref.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/poll.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/wait.h>

#include "fairvgpu_shim.h"

#define DRV_NAME "fairvgpu"
#define FVGPU_MAX_DEVICES 16
#define FVGPU_MAX_VECTORS 64
#define FVGPU_MAX_BINDS 8
#define FVGPU_HOST_PEER 1 /* transport/src/server.rs HOST_PEER */

/* ivshmem BAR0 registers. */
#define IVSHMEM_INTR_MASK 0x00
#define IVSHMEM_INTR_STATUS 0x04
#define IVSHMEM_IV_POSITION 0x08
#define IVSHMEM_DOORBELL 0x0c

/* The region header and channel control block (transport/src/layout.rs). */
#define HDR_MAGIC 0
#define HDR_CHANNELS 12
#define HDR_VECTORS 20
#define HDR_CHANNEL_STRIDE 32
#define HDR_CHANNELS_OFFSET 40
#define REGION_MAGIC 0x4d48535550475646ULL /* "FVGPUSHM" little-endian */
#define CTL_STATE 0
#define CTL_GENERATION 8
#define CLAIM_CLAIMED 2
#define CLAIM_ABANDONED 4
#define CLAIM_LOST 5 /* the host restarted; the owner still holds it */

struct fvgpu_dev {
	struct kref ref;
	struct pci_dev *pdev;
	struct device *dev;
	struct cdev cdev;
	int minor;
	void __iomem *regs; /* BAR0 */
	void *region; /* BAR2, write-back mapping */
	resource_size_t region_phys;
	resource_size_t region_len;
	u32 peer_id;
	unsigned int nvec;
	bool gone; /* the PCI device was removed: files fail with -ENODEV */
	struct mutex lock; /* gone, and ordering of remove against file ops */
	atomic64_t count[FVGPU_MAX_VECTORS];
	wait_queue_head_t wq[FVGPU_MAX_VECTORS];
	atomic64_t interrupts;
	atomic64_t wakeups;
};

struct fvgpu_vec {
	struct fvgpu_dev *fd;
	unsigned int vector;
};

struct fvgpu_file {
	struct fvgpu_dev *fd;
	struct mutex lock; /* vector, seen, binds */
	unsigned int vector;
	s64 seen;
	unsigned int nbinds;
	struct fvgpu_bind binds[FVGPU_MAX_BINDS];
};

static dev_t fvgpu_devt;
static struct class *fvgpu_class;
static DEFINE_IDA(fvgpu_ida);

static void fvgpu_free(struct kref *ref)
{
	struct fvgpu_dev *fd = container_of(ref, struct fvgpu_dev, ref);

	ida_free(&fvgpu_ida, fd->minor);
	kfree(fd);
}

static irqreturn_t fvgpu_irq(int irq, void *arg)
{
	struct fvgpu_vec *v = arg;
	struct fvgpu_dev *fd = v->fd;

	atomic64_inc(&fd->count[v->vector]);
	atomic64_inc(&fd->interrupts);
	wake_up_all(&fd->wq[v->vector]);
	return IRQ_HANDLED;
}

/* Reads a header word of the region, or 0 for anything out of range. */
static u64 region_u64(struct fvgpu_dev *fd, size_t off)
{
	if (!fd->region || off + 8 > fd->region_len)
		return 0;
	return READ_ONCE(*(u64 *)(fd->region + off));
}

static u32 region_u32(struct fvgpu_dev *fd, size_t off)
{
	if (!fd->region || off + 4 > fd->region_len)
		return 0;
	return READ_ONCE(*(u32 *)(fd->region + off));
}

static void fvgpu_ring(struct fvgpu_dev *fd, u32 peer, u32 vector)
{
	writel((peer << 16) | (vector & 0xffff), fd->regs + IVSHMEM_DOORBELL);
}

/*
 * A process died (or closed its file) still holding channel b->channel:
 * mark it abandoned if it is still the claim this process made, and ring
 * the host so that it frees the channel's context now rather than at its
 * next poll. The header is validated as the host would: a bad one means
 * there is nothing here to mark.
 */
static void fvgpu_abandon(struct fvgpu_dev *fd, const struct fvgpu_bind *b)
{
	u64 stride, base, off;
	u32 channels, host_vectors, *state, *gen;

	if (region_u64(fd, HDR_MAGIC) != REGION_MAGIC)
		return;
	channels = region_u32(fd, HDR_CHANNELS);
	stride = region_u64(fd, HDR_CHANNEL_STRIDE);
	base = region_u64(fd, HDR_CHANNELS_OFFSET);
	host_vectors = region_u32(fd, HDR_VECTORS);
	if (b->channel >= channels || stride < 256 || stride % 8 || base % 8 ||
	    base > fd->region_len || stride > fd->region_len)
		return;
	off = base + (u64)b->channel * stride;
	if (off + 256 > fd->region_len)
		return;
	state = fd->region + off + CTL_STATE;
	gen = fd->region + off + CTL_GENERATION;
	if (READ_ONCE(*gen) != b->generation)
		return;
	if (cmpxchg(state, CLAIM_CLAIMED, CLAIM_ABANDONED) != CLAIM_CLAIMED &&
	    cmpxchg(state, CLAIM_LOST, CLAIM_ABANDONED) != CLAIM_LOST)
		return;
	dev_info(fd->dev, "channel %u abandoned by an exiting process\n",
		 b->channel);
	if (host_vectors)
		fvgpu_ring(fd, FVGPU_HOST_PEER, b->channel % host_vectors);
}

static int fvgpu_open(struct inode *inode, struct file *file)
{
	struct fvgpu_dev *fd =
		container_of(inode->i_cdev, struct fvgpu_dev, cdev);
	struct fvgpu_file *f;

	mutex_lock(&fd->lock);
	if (fd->gone) {
		mutex_unlock(&fd->lock);
		return -ENODEV;
	}
	kref_get(&fd->ref);
	mutex_unlock(&fd->lock);

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f) {
		kref_put(&fd->ref, fvgpu_free);
		return -ENOMEM;
	}
	f->fd = fd;
	mutex_init(&f->lock);
	f->seen = fd->nvec ? atomic64_read(&fd->count[0]) : 0;
	file->private_data = f;
	return 0;
}

static int fvgpu_release(struct inode *inode, struct file *file)
{
	struct fvgpu_file *f = file->private_data;
	struct fvgpu_dev *fd = f->fd;
	unsigned int i;

	mutex_lock(&fd->lock);
	if (!fd->gone)
		for (i = 0; i < f->nbinds; i++)
			fvgpu_abandon(fd, &f->binds[i]);
	mutex_unlock(&fd->lock);
	kfree(f);
	kref_put(&fd->ref, fvgpu_free);
	return 0;
}

static int fvgpu_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct fvgpu_file *f = file->private_data;
	struct fvgpu_dev *fd = f->fd;
	unsigned long len = vma->vm_end - vma->vm_start;
	unsigned long off = vma->vm_pgoff << PAGE_SHIFT;

	if (READ_ONCE(fd->gone))
		return -ENODEV;
	if (vma->vm_pgoff > (fd->region_len >> PAGE_SHIFT) ||
	    len > fd->region_len - off)
		return -EINVAL;
	/* Guest RAM on the host side: cached like RAM, not like MMIO. */
	return io_remap_pfn_range(vma, vma->vm_start,
				  (fd->region_phys + off) >> PAGE_SHIFT, len,
				  vma->vm_page_prot);
}

static bool fvgpu_pending(struct fvgpu_file *f)
{
	struct fvgpu_dev *fd = f->fd;

	return READ_ONCE(fd->gone) ||
	       atomic64_read(&fd->count[READ_ONCE(f->vector)]) !=
		       READ_ONCE(f->seen);
}

/* Consumes pending interrupts on the file's vector; returns the count. */
static s64 fvgpu_consume(struct fvgpu_file *f)
{
	s64 now = atomic64_read(&f->fd->count[f->vector]);

	WRITE_ONCE(f->seen, now);
	return now;
}

static long fvgpu_wait(struct fvgpu_file *f, u64 timeout_us)
{
	struct fvgpu_dev *fd = f->fd;
	unsigned long t;
	long left;
	bool slept;

	if (!fd->nvec)
		return -EOPNOTSUPP;
	timeout_us = min_t(u64, timeout_us, 10ULL * USEC_PER_SEC);
	t = max_t(unsigned long, usecs_to_jiffies(timeout_us), 1);
	slept = !fvgpu_pending(f);
	left = wait_event_interruptible_timeout(fd->wq[f->vector],
						fvgpu_pending(f), t);
	if (left < 0)
		return left;
	if (READ_ONCE(fd->gone))
		return -ENODEV;
	if (left == 0 && !fvgpu_pending(f))
		return 0;
	if (slept)
		atomic64_inc(&fd->wakeups);
	fvgpu_consume(f);
	return 1;
}

static long fvgpu_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct fvgpu_file *f = file->private_data;
	struct fvgpu_dev *fd = f->fd;
	void __user *uarg = (void __user *)arg;
	long ret = 0;
	u32 v;

	if (READ_ONCE(fd->gone))
		return -ENODEV;
	switch (cmd) {
	case FVGPU_IOC_INFO: {
		struct fvgpu_info info = {
			.region_size = fd->region_len,
			.peer_id = fd->peer_id,
			.vectors = fd->nvec,
			.interrupts = atomic64_read(&fd->interrupts),
			.wakeups = atomic64_read(&fd->wakeups),
		};

		if (copy_to_user(uarg, &info, sizeof(info)))
			return -EFAULT;
		return 0;
	}
	case FVGPU_IOC_RING:
		if (get_user(v, (u32 __user *)uarg))
			return -EFAULT;
		/* QEMU ignores unknown peers and vectors; refuse them anyway. */
		if ((v & 0xffff) >= FVGPU_MAX_VECTORS)
			return -EINVAL;
		/* Under the lock: remove() may be unmapping BAR0. */
		mutex_lock(&fd->lock);
		if (fd->gone)
			ret = -ENODEV;
		else
			fvgpu_ring(fd, v >> 16, v & 0xffff);
		mutex_unlock(&fd->lock);
		return ret;
	case FVGPU_IOC_SET_VECTOR:
		if (get_user(v, (u32 __user *)uarg))
			return -EFAULT;
		if (v >= fd->nvec)
			return -EINVAL;
		mutex_lock(&f->lock);
		if (v != f->vector) {
			WRITE_ONCE(f->vector, v);
			fvgpu_consume(f);
		}
		mutex_unlock(&f->lock);
		return 0;
	case FVGPU_IOC_WAIT: {
		struct fvgpu_wait w;

		if (copy_from_user(&w, uarg, sizeof(w)))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = fvgpu_wait(f, w.timeout_us);
		mutex_unlock(&f->lock);
		return ret;
	}
	case FVGPU_IOC_BIND: {
		struct fvgpu_bind b;
		unsigned int i;

		if (copy_from_user(&b, uarg, sizeof(b)))
			return -EFAULT;
		mutex_lock(&f->lock);
		for (i = 0; i < f->nbinds; i++)
			if (f->binds[i].channel == b.channel)
				break;
		if (i < f->nbinds)
			f->binds[i] = b;
		else if (f->nbinds < FVGPU_MAX_BINDS)
			f->binds[f->nbinds++] = b;
		else
			ret = -ENOSPC;
		mutex_unlock(&f->lock);
		return ret;
	}
	case FVGPU_IOC_UNBIND: {
		unsigned int i;

		if (get_user(v, (u32 __user *)uarg))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = -ENOENT;
		for (i = 0; i < f->nbinds; i++) {
			if (f->binds[i].channel == v) {
				f->binds[i] = f->binds[--f->nbinds];
				ret = 0;
				break;
			}
		}
		mutex_unlock(&f->lock);
		return ret;
	}
	default:
		return -ENOTTY;
	}
}

static __poll_t fvgpu_poll(struct file *file, poll_table *wait)
{
	struct fvgpu_file *f = file->private_data;
	struct fvgpu_dev *fd = f->fd;

	if (!fd->nvec)
		return EPOLLERR;
	poll_wait(file, &fd->wq[READ_ONCE(f->vector)], wait);
	if (READ_ONCE(fd->gone))
		return EPOLLHUP | EPOLLERR;
	return fvgpu_pending(f) ? EPOLLIN | EPOLLRDNORM : 0;
}

static ssize_t fvgpu_read(struct file *file, char __user *buf, size_t len,
			  loff_t *ppos)
{
	struct fvgpu_file *f = file->private_data;
	struct fvgpu_dev *fd = f->fd;
	s64 count;
	int ret;

	if (len < sizeof(u64))
		return -EINVAL;
	if (!fd->nvec)
		return -EOPNOTSUPP;
	if (!fvgpu_pending(f)) {
		if (file->f_flags & O_NONBLOCK)
			return -EAGAIN;
		ret = wait_event_interruptible(fd->wq[READ_ONCE(f->vector)],
					       fvgpu_pending(f));
		if (ret)
			return ret;
		atomic64_inc(&fd->wakeups);
	}
	if (READ_ONCE(fd->gone))
		return -ENODEV;
	mutex_lock(&f->lock);
	count = fvgpu_consume(f);
	mutex_unlock(&f->lock);
	if (put_user((u64)count, (u64 __user *)buf))
		return -EFAULT;
	return sizeof(u64);
}

static const struct file_operations fvgpu_fops = {
	.owner = THIS_MODULE,
	.open = fvgpu_open,
	.release = fvgpu_release,
	.mmap = fvgpu_mmap,
	.unlocked_ioctl = fvgpu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.poll = fvgpu_poll,
	.read = fvgpu_read,
	.llseek = noop_llseek,
};

/* sysfs: /sys/class/fairvgpu/fairvgpuN/{interrupts,wakeups,peer_id,vectors,region_size} */
static ssize_t interrupts_show(struct device *d, struct device_attribute *a,
			       char *buf)
{
	struct fvgpu_dev *fd = dev_get_drvdata(d);

	return sysfs_emit(buf, "%lld\n", atomic64_read(&fd->interrupts));
}
static DEVICE_ATTR_RO(interrupts);

static ssize_t wakeups_show(struct device *d, struct device_attribute *a,
			    char *buf)
{
	struct fvgpu_dev *fd = dev_get_drvdata(d);

	return sysfs_emit(buf, "%lld\n", atomic64_read(&fd->wakeups));
}
static DEVICE_ATTR_RO(wakeups);

static ssize_t peer_id_show(struct device *d, struct device_attribute *a,
			    char *buf)
{
	struct fvgpu_dev *fd = dev_get_drvdata(d);

	return sysfs_emit(buf, "%u\n", fd->peer_id);
}
static DEVICE_ATTR_RO(peer_id);

static ssize_t vectors_show(struct device *d, struct device_attribute *a,
			    char *buf)
{
	struct fvgpu_dev *fd = dev_get_drvdata(d);

	return sysfs_emit(buf, "%u\n", fd->nvec);
}
static DEVICE_ATTR_RO(vectors);

static ssize_t region_size_show(struct device *d, struct device_attribute *a,
				char *buf)
{
	struct fvgpu_dev *fd = dev_get_drvdata(d);

	return sysfs_emit(buf, "%llu\n", (unsigned long long)fd->region_len);
}
static DEVICE_ATTR_RO(region_size);

static struct attribute *fvgpu_attrs[] = {
	&dev_attr_interrupts.attr, &dev_attr_wakeups.attr,
	&dev_attr_peer_id.attr,	   &dev_attr_vectors.attr,
	&dev_attr_region_size.attr, NULL,
};
ATTRIBUTE_GROUPS(fvgpu);

static void fvgpu_free_irqs(struct fvgpu_dev *fd, unsigned int n,
			    struct fvgpu_vec *vecs)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		int irq = pci_irq_vector(fd->pdev, i);

		irq_set_affinity_and_hint(irq, NULL);
		free_irq(irq, &vecs[i]);
	}
}

static int fvgpu_setup_irqs(struct fvgpu_dev *fd, struct fvgpu_vec *vecs)
{
	struct pci_dev *pdev = fd->pdev;
	int nvec, i, ret;

	nvec = pci_msix_vec_count(pdev);
	if (nvec <= 0) {
		dev_warn(&pdev->dev,
			 "no MSI-X: waiting falls back to polling\n");
		return 0;
	}
	nvec = min(nvec, FVGPU_MAX_VECTORS);
	nvec = pci_alloc_irq_vectors(pdev, 1, nvec, PCI_IRQ_MSIX);
	if (nvec < 0)
		return nvec;
	for (i = 0; i < nvec; i++) {
		int irq = pci_irq_vector(pdev, i);

		vecs[i].fd = fd;
		vecs[i].vector = i;
		ret = request_irq(irq, fvgpu_irq, 0, DRV_NAME, &vecs[i]);
		if (ret) {
			fvgpu_free_irqs(fd, i, vecs);
			pci_free_irq_vectors(pdev);
			return ret;
		}
		/* Vector k is delivered to vCPU k: the host kicks the vCPU that waits. */
		irq_set_affinity_and_hint(irq, cpumask_of(i % nr_cpu_ids));
	}
	fd->nvec = nvec;
	return 0;
}

struct fvgpu_pci {
	struct fvgpu_dev *fd;
	struct fvgpu_vec vecs[FVGPU_MAX_VECTORS];
};

static int fvgpu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct fvgpu_pci *p;
	struct fvgpu_dev *fd;
	int ret, minor, i;

	p = devm_kzalloc(&pdev->dev, sizeof(*p), GFP_KERNEL);
	fd = kzalloc(sizeof(*fd), GFP_KERNEL);
	if (!p || !fd) {
		kfree(fd);
		return -ENOMEM;
	}
	minor = ida_alloc_max(&fvgpu_ida, FVGPU_MAX_DEVICES - 1, GFP_KERNEL);
	if (minor < 0) {
		kfree(fd);
		return minor;
	}
	kref_init(&fd->ref);
	mutex_init(&fd->lock);
	fd->pdev = pdev;
	fd->minor = minor;
	for (i = 0; i < FVGPU_MAX_VECTORS; i++)
		init_waitqueue_head(&fd->wq[i]);
	p->fd = fd;

	ret = pcim_enable_device(pdev);
	if (ret)
		goto err_put;
	ret = pcim_iomap_regions(pdev, BIT(0), DRV_NAME);
	if (ret)
		goto err_put;
	fd->regs = pcim_iomap_table(pdev)[0];
	fd->region_phys = pci_resource_start(pdev, 2);
	fd->region_len = pci_resource_len(pdev, 2);
	if (!fd->region_phys || fd->region_len < PAGE_SIZE) {
		dev_err(&pdev->dev, "BAR2 (the shared region) is missing\n");
		ret = -ENODEV;
		goto err_put;
	}
	ret = pci_request_region(pdev, 2, DRV_NAME);
	if (ret)
		goto err_put;
	fd->region = memremap(fd->region_phys, fd->region_len, MEMREMAP_WB);
	if (!fd->region) {
		ret = -ENOMEM;
		goto err_region;
	}
	fd->peer_id = readl(fd->regs + IVSHMEM_IV_POSITION);
	pci_set_master(pdev);
	ret = fvgpu_setup_irqs(fd, p->vecs);
	if (ret)
		goto err_unmap;
	pci_set_drvdata(pdev, p);

	cdev_init(&fd->cdev, &fvgpu_fops);
	fd->cdev.owner = THIS_MODULE;
	ret = cdev_add(&fd->cdev, MKDEV(MAJOR(fvgpu_devt), minor), 1);
	if (ret)
		goto err_irqs;
	fd->dev = device_create_with_groups(fvgpu_class, &pdev->dev,
					    MKDEV(MAJOR(fvgpu_devt), minor), fd,
					    fvgpu_groups, DRV_NAME "%d", minor);
	if (IS_ERR(fd->dev)) {
		ret = PTR_ERR(fd->dev);
		goto err_cdev;
	}
	dev_info(&pdev->dev,
		 "fairvgpu%d: region %llu bytes, peer %u, %u vectors\n", minor,
		 (unsigned long long)fd->region_len, fd->peer_id, fd->nvec);
	return 0;

err_cdev:
	cdev_del(&fd->cdev);
err_irqs:
	fvgpu_free_irqs(fd, fd->nvec, p->vecs);
	if (fd->nvec)
		pci_free_irq_vectors(pdev);
err_unmap:
	memunmap(fd->region);
err_region:
	pci_release_region(pdev, 2);
err_put:
	kref_put(&fd->ref, fvgpu_free);
	return ret;
}

static void fvgpu_remove(struct pci_dev *pdev)
{
	struct fvgpu_pci *p = pci_get_drvdata(pdev);
	struct fvgpu_dev *fd = p->fd;
	unsigned int i;

	device_destroy(fvgpu_class, MKDEV(MAJOR(fvgpu_devt), fd->minor));
	cdev_del(&fd->cdev);
	/*
	 * Open files keep fd alive but must not touch the device any more:
	 * waiters are woken and fail with -ENODEV. Mappings that processes
	 * still hold point at a BAR that is going away; the host reclaims
	 * every channel of a peer that disconnects, so nothing leaks there.
	 */
	mutex_lock(&fd->lock);
	WRITE_ONCE(fd->gone, true);
	mutex_unlock(&fd->lock);
	for (i = 0; i < FVGPU_MAX_VECTORS; i++)
		wake_up_all(&fd->wq[i]);
	fvgpu_free_irqs(fd, fd->nvec, p->vecs);
	if (fd->nvec)
		pci_free_irq_vectors(pdev);
	memunmap(fd->region);
	fd->region = NULL;
	pci_release_region(pdev, 2);
	dev_info(&pdev->dev, "fairvgpu%d removed\n", fd->minor);
	kref_put(&fd->ref, fvgpu_free);
}

static const struct pci_device_id fvgpu_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },
	{ 0 },
};
MODULE_DEVICE_TABLE(pci, fvgpu_ids);

static struct pci_driver fvgpu_driver = {
	.name = DRV_NAME,
	.id_table = fvgpu_ids,
	.probe = fvgpu_probe,
	.remove = fvgpu_remove,
};

static int __init fvgpu_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&fvgpu_devt, 0, FVGPU_MAX_DEVICES, DRV_NAME);
	if (ret)
		return ret;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	fvgpu_class = class_create(DRV_NAME);
#else
	fvgpu_class = class_create(THIS_MODULE, DRV_NAME);
#endif
	if (IS_ERR(fvgpu_class)) {
		ret = PTR_ERR(fvgpu_class);
		goto err_chrdev;
	}
	ret = pci_register_driver(&fvgpu_driver);
	if (ret)
		goto err_class;
	return 0;

err_class:
	class_destroy(fvgpu_class);
err_chrdev:
	unregister_chrdev_region(fvgpu_devt, FVGPU_MAX_DEVICES);
	return ret;
}

static void __exit fvgpu_exit(void)
{
	pci_unregister_driver(&fvgpu_driver);
	class_destroy(fvgpu_class);
	unregister_chrdev_region(fvgpu_devt, FVGPU_MAX_DEVICES);
}

module_init(fvgpu_init);
module_exit(fvgpu_exit);

MODULE_DESCRIPTION("fairvgpu guest shim for the ivshmem-doorbell device");
MODULE_LICENSE("GPL");
