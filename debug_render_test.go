package troupe

import (
	"strings"
	"testing"
	"time"
)

// The page's member table gives a member this node has no association
// with a dash for its name, not an empty cell (#55).
func TestThePageNamesAMemberWithoutAnAssociationWithADash(t *testing.T) {
	t.Parallel()
	addr, err := ParseAddr("127.0.0.1:7001")
	if err != nil {
		t.Fatal(err)
	}
	s := Stats{Name: "n", Taken: time.Now(), Members: []memberStats{{Member: Member{Addr: addr, Status: MemberUp, UpNumber: 2}, Reachable: true}}}
	var b strings.Builder
	if err := debugPage.Execute(&b, pageData(s, nil)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "<td>tcp://127.0.0.1:7001</td><td>—</td>") {
		t.Fatalf("the member's row:\n%s", b.String())
	}
}
