package troupe

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// frameStream returns frames of sizes from 1 byte to 300 KiB (larger than
// the read buffer), each body filled with its index.
func frameStream(r *rand.Rand, count int) (stream []byte, bodies [][]byte) {
	for i := range count {
		var size int
		switch r.IntN(4) {
		case 0:
			size = 1 + r.IntN(32)
		case 1:
			size = 1 + r.IntN(idleReadSize*2)
		case 2:
			size = 1 + r.IntN(readBufferSize*2)
		default:
			size = 1 + r.IntN(300<<10)
		}
		body := bytes.Repeat([]byte{byte(i)}, size)
		bodies = append(bodies, body)
		stream = appendWhole(stream, body)
	}
	return stream, bodies
}

// chunky reads at most a random count of bytes each time, as a socket
// returns what has arrived.
type chunky struct {
	r   io.Reader
	rnd *rand.Rand
}

func (c chunky) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1+c.rnd.IntN(min(len(p), 3000))]
	}
	return c.r.Read(p)
}

// Every frame comes back whole and in order, whatever the source returns
// per read, the small buffer and the pooled one taking turns.
func TestFrameReaderOverAnyChunking(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	stream, bodies := frameStream(rnd, 300)
	// A byte at a time, 300 frames are 15 million reads (a minute under
	// the race detector): that reader gets 40, every size class among them.
	short, shortBodies := frameStream(rand.New(rand.NewPCG(5, 6)), 40)
	classes := map[string]bool{}
	for _, b := range shortBodies {
		switch n := len(b); {
		case n <= 32:
			classes["tiny"] = true
		case n <= idleReadSize:
			classes["within the idle buffer"] = true
		case n <= readBufferSize:
			classes["within the read buffer"] = true
		default:
			classes["past the read buffer"] = true
		}
	}
	if len(classes) != 4 {
		t.Fatalf("the 40-frame stream has sizes %v; want every class", classes)
	}
	sources := map[string]func() (io.Reader, [][]byte){
		"whole":    func() (io.Reader, [][]byte) { return bytes.NewReader(stream), bodies },
		"one byte": func() (io.Reader, [][]byte) { return iotest.OneByteReader(bytes.NewReader(short)), shortBodies },
		"half":     func() (io.Reader, [][]byte) { return iotest.HalfReader(bytes.NewReader(stream)), bodies },
		"data+err": func() (io.Reader, [][]byte) { return iotest.DataErrReader(bytes.NewReader(stream)), bodies },
		"chunky": func() (io.Reader, [][]byte) {
			return chunky{bytes.NewReader(stream), rand.New(rand.NewPCG(3, 4))}, bodies
		},
	}
	for name, src := range sources {
		for _, waits := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/await=%v", name, waits), func(t *testing.T) {
				r, bodies := src()
				frameReaderOver(t, r, bodies, waits)
			})
		}
	}
}

// frameReaderOver reads bodies back from src, as readLoop does if waits
// (fr.complete, then fr.await before each frame).
func frameReaderOver(t *testing.T, src io.Reader, bodies [][]byte, waits bool) {
	fr := newFrameReader(src, defaultMaxFrameSize)
	for i, want := range bodies {
		if waits && !fr.complete() {
			fr.await()
		}
		got, err := fr.next()
		if err != nil {
			t.Fatalf("frame %d of %d bytes: %v", i, len(want), err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, want %d", i, len(got), len(want))
		}
	}
	if _, err := fr.next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// A reader that took the pooled buffer for a burst gives it back once a
// quiet read finds it empty: an idle association holds idleReadSize bytes
// for reading.
func TestAQuietReaderGivesBackItsBuffer(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	pr, pw := io.Pipe()
	fr := newFrameReader(pr, defaultMaxFrameSize)
	var burst []byte
	for range 10 {
		burst = appendWhole(burst, make([]byte, 20<<10))
	}
	go func() {
		pw.Write(burst)
		for range 3 {
			pw.Write(appendWhole(nil, appendHeartbeat(nil))) // a quiet link's traffic
		}
		pw.Close()
	}()
	for i := range 10 {
		if _, err := fr.next(); err != nil {
			t.Fatal(err)
		}
		if fr.r.big == nil {
			t.Fatalf("frame %d of a burst of 20 KiB frames was read without the pooled buffer", i)
		}
	}
	for range 3 {
		if _, err := fr.next(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fr.next(); err != io.EOF {
		t.Fatal(err)
	}
	if fr.r.big != nil || fr.scratch != nil {
		t.Fatalf("a quiet reader holds %d bytes of buffer and %d of scratch", len(fr.r.buf), cap(fr.scratch))
	}
}

// A frame that fills the small buffer exactly and arrives alone takes
// the pooled buffer for the next read (it looks like a stream), and the
// quiet link gives it back with the next heartbeat.
func TestALoneFrameOfTheSmallBuffersSizeIsGivenBackAtTheNextHeartbeat(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	pr, pw := io.Pipe()
	fr := newFrameReader(pr, defaultMaxFrameSize)
	frame := appendWhole(nil, make([]byte, idleReadSize-2)) // two bytes of length prefix
	if len(frame) != idleReadSize {
		t.Fatalf("the frame is %d bytes", len(frame))
	}
	go func() {
		pw.Write(frame)
		pw.Write(appendWhole(nil, appendHeartbeat(nil)))
		pw.Write(appendWhole(nil, appendHeartbeat(nil)))
		pw.Close()
	}()
	for range 3 {
		fr.complete()
		fr.await()
		if _, err := fr.next(); err != nil {
			t.Fatal(err)
		}
	}
	if fr.r.big != nil {
		t.Fatal("the reader kept the pooled buffer after a heartbeat")
	}
}

// countingReader counts the reads from its source.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// A stream of small frames is read in the pooled buffer's large reads,
// not the small buffer's: a read that fills the small buffer says more is
// coming (#33: every read of a stream of tells brought 1 KiB, 155,000
// read calls for 20 million tells).
func TestAStreamOfSmallFramesIsReadInLargeReads(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var stream []byte
	for i := range 200000 {
		stream = appendWhole(stream, []byte{byte(frameTell), byte(i), byte(i >> 8), 3, 4, 5, 6})
	}
	src := &countingReader{r: bytes.NewReader(stream)}
	fr := newFrameReader(src, defaultMaxFrameSize)
	frames := 0
	for {
		fr.await() // as readLoop waits, with nothing buffered
		if _, err := fr.next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		frames++
	}
	if frames != 200000 {
		t.Fatalf("%d frames of 200000", frames)
	}
	if most := len(stream)/readBufferSize + 4; src.reads > most {
		t.Fatalf("%d bytes took %d reads; a %d-byte buffer takes at most %d", len(stream), src.reads, readBufferSize, most)
	}
}
