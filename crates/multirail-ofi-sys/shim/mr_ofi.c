/* Out-of-line wrappers over libfabric's static-inline calls; see mr_ofi.h. */
#include "mr_ofi.h"

uint32_t mr_ofi_header_version(void)
{
	return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

uint64_t mr_ofi_addr_unspec(void)
{
	return FI_ADDR_UNSPEC;
}

struct fi_info *mr_ofi_allocinfo(void)
{
	return fi_allocinfo();
}

int mr_ofi_close(struct fid *fid)
{
	return fi_close(fid);
}

int mr_ofi_domain(struct fid_fabric *fabric, struct fi_info *info,
		  struct fid_domain **domain, void *context)
{
	return fi_domain(fabric, info, domain, context);
}

int mr_ofi_endpoint(struct fid_domain *domain, struct fi_info *info,
		    struct fid_ep **ep, void *context)
{
	return fi_endpoint(domain, info, ep, context);
}

int mr_ofi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
		   struct fid_cq **cq, void *context)
{
	return fi_cq_open(domain, attr, cq, context);
}

int mr_ofi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
		   struct fid_av **av, void *context)
{
	return fi_av_open(domain, attr, av, context);
}

int mr_ofi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags)
{
	return fi_ep_bind(ep, bfid, flags);
}

int mr_ofi_enable(struct fid_ep *ep)
{
	return fi_enable(ep);
}

int mr_ofi_getname(struct fid *fid, void *addr, size_t *addrlen)
{
	return fi_getname(fid, addr, addrlen);
}

int mr_ofi_setname(struct fid *fid, void *addr, size_t addrlen)
{
	return fi_setname(fid, addr, addrlen);
}

int mr_ofi_av_insert(struct fid_av *av, const void *addr, size_t count,
		     fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	return fi_av_insert(av, addr, count, fi_addr, flags, context);
}

int mr_ofi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
		     uint64_t flags)
{
	return fi_av_remove(av, fi_addr, count, flags);
}

int mr_ofi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		  uint64_t access, uint64_t offset, uint64_t requested_key,
		  uint64_t flags, struct fid_mr **mr, void *context)
{
	return fi_mr_reg(domain, buf, len, access, offset, requested_key,
			 flags, mr, context);
}

void *mr_ofi_mr_desc(struct fid_mr *mr)
{
	return fi_mr_desc(mr);
}

uint64_t mr_ofi_mr_key(struct fid_mr *mr)
{
	return fi_mr_key(mr);
}

int mr_ofi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags)
{
	return fi_mr_bind(mr, bfid, flags);
}

int mr_ofi_mr_enable(struct fid_mr *mr)
{
	return fi_mr_enable(mr);
}

ssize_t mr_ofi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		    fi_addr_t dest_addr, void *context)
{
	return fi_send(ep, buf, len, desc, dest_addr, context);
}

ssize_t mr_ofi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		    fi_addr_t src_addr, void *context)
{
	return fi_recv(ep, buf, len, desc, src_addr, context);
}

ssize_t mr_ofi_inject(struct fid_ep *ep, const void *buf, size_t len,
		      fi_addr_t dest_addr)
{
	return fi_inject(ep, buf, len, dest_addr);
}

ssize_t mr_ofi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		     fi_addr_t dest_addr, uint64_t tag, void *context)
{
	return fi_tsend(ep, buf, len, desc, dest_addr, tag, context);
}

ssize_t mr_ofi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		     fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
		     void *context)
{
	return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context);
}

ssize_t mr_ofi_tinject(struct fid_ep *ep, const void *buf, size_t len,
		       fi_addr_t dest_addr, uint64_t tag)
{
	return fi_tinject(ep, buf, len, dest_addr, tag);
}

ssize_t mr_ofi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		    fi_addr_t src_addr, uint64_t addr, uint64_t key,
		    void *context)
{
	return fi_read(ep, buf, len, desc, src_addr, addr, key, context);
}

ssize_t mr_ofi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		     fi_addr_t dest_addr, uint64_t addr, uint64_t key,
		     void *context)
{
	return fi_write(ep, buf, len, desc, dest_addr, addr, key, context);
}

ssize_t mr_ofi_cq_read(struct fid_cq *cq, void *buf, size_t count)
{
	return fi_cq_read(cq, buf, count);
}

ssize_t mr_ofi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
			  uint64_t flags)
{
	return fi_cq_readerr(cq, buf, flags);
}

const char *mr_ofi_cq_strerror(struct fid_cq *cq, int prov_errno,
			       const void *err_data, char *buf, size_t len)
{
	return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}

ssize_t mr_ofi_cancel(struct fid *fid, void *context)
{
	return fi_cancel(fid, context);
}

int mr_ofi_control(struct fid *fid, int command, void *arg)
{
	return fi_control(fid, command, arg);
}

int mr_ofi_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{
	return fi_trywait(fabric, fids, count);
}
