package execagent

// ring keeps the last len(buf) bytes of a stream addressed by absolute
// offsets. It is not safe for concurrent use; callers hold a lock.
type ring struct {
	buf   []byte
	total int64 // bytes ever written
}

func newRing(size int64) *ring { return &ring{buf: make([]byte, 0, size)} }

// write appends b, dropping the oldest bytes beyond the capacity.
func (r *ring) write(b []byte) {
	size := cap(r.buf)
	if len(b) >= size {
		tail := b[len(b)-size:]
		r.total += int64(len(b))
		r.buf = r.buf[:size]
		start := int((r.total - int64(size)) % int64(size)) // the oldest byte's index
		n := copy(r.buf[start:], tail)
		copy(r.buf, tail[n:])
		return
	}
	if len(r.buf) < size { // not full yet: plain append, then wrap
		n := min(size-len(r.buf), len(b))
		r.buf = append(r.buf, b[:n]...)
		r.total += int64(n)
		b = b[n:]
		if len(b) == 0 {
			return
		}
	}
	// Full: the oldest byte sits at total%size; overwrite from there.
	pos := int(r.total % int64(size))
	n := copy(r.buf[pos:], b)
	copy(r.buf, b[n:])
	r.total += int64(len(b))
}

// oldest returns the offset of the oldest retained byte.
func (r *ring) oldest() int64 { return r.total - int64(len(r.buf)) }

// read returns up to limit bytes from offset off (clamped to the oldest
// retained byte) as a new slice, the offset it read from and how many bytes
// were dropped before it.
func (r *ring) read(off int64, limit int) (data []byte, from int64, dropped int64) {
	from = off
	if old := r.oldest(); from < old {
		dropped = old - from
		from = old
	}
	if from >= r.total || limit <= 0 {
		return nil, from, dropped
	}
	n := int(min(r.total-from, int64(limit)))
	data = make([]byte, n)
	size := int64(cap(r.buf))
	if len(r.buf) < cap(r.buf) { // not wrapped: offsets are indexes
		copy(data, r.buf[from:])
		return data, from, dropped
	}
	pos := int(from % size)
	k := copy(data, r.buf[pos:])
	copy(data[k:], r.buf)
	return data, from, dropped
}
