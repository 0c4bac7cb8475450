package troupe

import (
	"errors"
	"testing"
)

func TestRefStrings(t *testing.T) {
	for _, a := range []Addr{TCPAddr("127.0.0.1:7001"), UnixAddr("/run/app/a.sock"), TCPAddr("[::1]:5")} {
		s := FormatRef(a, "/user/worker")
		got, path, err := ParseRef(s)
		if err != nil || got != a || path != "/user/worker" {
			t.Errorf("ParseRef(%q) = %v, %q, %v; want %v, /user/worker", s, got, path, err, a)
		}
	}
	for _, bad := range []string{"http://x/y", "troupe://127.0.0.1:1", "troupe://127.0.0.1:1/", "troupe+unix://rel.sock/a", "troupe://nohost/a"} {
		if _, _, err := ParseRef(bad); !errors.Is(err, ErrBadAddr) {
			t.Errorf("ParseRef(%q) = %v, want ErrBadAddr", bad, err)
		}
	}
}
