package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"troupe"
)

// Two versions of a service's message types, as two builds of it would
// register them: the helper process registers v1's or v2's by
// $TROUPE_CLI_SCHEMA. order gained a field (compatible); code changed a
// field's kind (incompatible); refund exists only in v2.
type orderV1 struct {
	ID    int64
	Total int64
}

type orderV2 struct {
	ID    int64
	Total int64
	Note  string
}

type codeV1 struct{ C string }

type codeV2 struct{ C int64 }

type refundV2 struct{ ID int64 }

func init() {
	switch os.Getenv("TROUPE_CLI_SCHEMA") {
	case "v1":
		troupe.SetWireKey[orderV1]("shop.order")
		troupe.SetWireKey[codeV1]("shop.code")
	case "v2":
		troupe.SetWireKey[orderV2]("shop.order")
		troupe.SetWireKey[codeV2]("shop.code")
		troupe.SetWireKey[refundV2]("shop.refund")
	}
}

// TestHelperSchemaNode is not a test: TestSchemaDiff runs it in a child
// process, which prints "READY addr" and serves until stdin closes.
func TestHelperSchemaNode(t *testing.T) {
	t.Parallel()
	v := os.Getenv("TROUPE_CLI_SCHEMA")
	if v == "" {
		t.Skip("helper for TestSchemaDiff")
	}
	n, err := troupe.Start(context.Background(), troupe.Config{Name: "shop-" + v, AppVersion: v, Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	fmt.Printf("READY %s\n", n.Addrs()[0])
	io.Copy(io.Discard, os.Stdin)
}

// schemaNode runs the helper as version v and returns its address.
func schemaNode(t *testing.T, v string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperSchemaNode$")
	cmd.Env = append(os.Environ(), "TROUPE_CLI_SCHEMA="+v)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	lines := make(chan string, 1)
	go func() {
		in := bufio.NewScanner(stdout)
		in.Scan()
		lines <- in.Text()
		io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-lines:
		f := strings.Fields(l)
		if len(f) != 2 || f[0] != "READY" {
			t.Fatalf("the %s node said %q", v, l)
		}
		return f[1]
	case <-time.After(15 * time.Second):
		t.Fatalf("the %s node said nothing", v)
		return ""
	}
}

// troupe schema prints a running node's message types; troupe schema
// diff compares two nodes' (two builds of one service) by the rules a
// session applies, and exits 1 when a type is incompatible.
func TestSchemaDiff(t *testing.T) {
	t.Parallel()
	v1, v2 := schemaNode(t, "v1"), schemaNode(t, "v2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run1 := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, args, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	out, errOut, code := run1("schema", "--node", v2)
	if code != 0 || !strings.Contains(out, "shop.order") || !strings.Contains(out, "struct { ID int; Total int; Note string }") ||
		!strings.Contains(out, "shop.refund") || !strings.Contains(out, "main.orderV2") {
		t.Fatalf("schema: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run1("schema", "diff", "--node", v1, "--node", v2)
	t.Logf("schema diff:\n%s%s", out, errOut)
	if code != 3 || !strings.Contains(errOut, "1 incompatible or unchecked type") {
		t.Fatalf("schema diff: exit %d, want 3 for an incompatible type\n%s", code, errOut)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			lines[f[0]] = l
		}
	}
	if l := lines["shop.order"]; !strings.Contains(l, "compatible") || strings.Contains(l, "incompatible") || !strings.Contains(l, "fields only B has: Note") {
		t.Errorf("order: %q", l)
	}
	if l := lines["shop.code"]; !strings.Contains(l, "incompatible") || !strings.Contains(l, "field C: the sender's is string, the receiver's a signed integer") {
		t.Errorf("code: %q", l)
	}
	if l := lines["shop.refund"]; !strings.Contains(l, "only on B") {
		t.Errorf("refund: %q", l)
	}
	if _, ok := lines["troupe.stats.request"]; ok {
		t.Errorf("a type the same on both is listed: %q", lines["troupe.stats.request"])
	}
	out, _, code = run1("schema", "diff", "--node", v1, "--node", v2, "--json")
	var verdicts []schemaDiffJSON
	if code != 3 || json.Unmarshal([]byte(out), &verdicts) != nil {
		t.Fatalf("schema diff --json: exit %d\n%s", code, out)
	}
	by := map[string]string{}
	for _, v := range verdicts {
		by[v.Key] = v.Verdict
	}
	if by["shop.order"] != "compatible" || by["shop.code"] != "incompatible" || by["shop.refund"] != "only_b" || by["troupe.stats.request"] != "same" {
		t.Fatalf("schema diff --json verdicts: %v", by)
	}
	if _, errOut, code := run1("schema", "diff", "--node", v1, "--node", v1); code != 0 || errOut != "" {
		t.Fatalf("a node against itself: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run1("schema", "diff", "--node", v1, "--node", "127.0.0.1:1", "--timeout", "2s"); code != 1 || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("diff with a node that does not answer: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run1("schema", "diff", "--node", v1); code != 2 || !strings.Contains(errOut, "give --node 2 time(s)") {
		t.Fatalf("diff with one node: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run1("schema", "sideways", "--node", v1); code != 2 || !strings.Contains(errOut, "unexpected argument") {
		t.Fatalf("an unknown argument: exit %d, %q", code, errOut)
	}
}
