//go:build race

#include "textflag.h"

// func getg() uintptr: the g of the calling goroutine, from thread-local
// storage.
TEXT ·getg(SB), NOSPLIT, $0-8
	MOVQ (TLS), AX
	MOVQ AX, ret+0(FP)
	RET
