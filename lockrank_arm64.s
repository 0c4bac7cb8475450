//go:build race

#include "textflag.h"

// func getg() uintptr: the g of the calling goroutine, which arm64 keeps
// in a register.
TEXT ·getg(SB), NOSPLIT, $0-8
	MOVD g, R0
	MOVD R0, ret+0(FP)
	RET
