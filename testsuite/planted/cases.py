"""The planted cases: wrong candidates `kstrata verify` must reject and correct rewrites it must accept.

Each edit is anchored on the text Triton 3.6 produces for the suite kernel (and fails loudly when the
anchor moves). Edits are in the level's own syntax; PTX and AMDGCN lines start with a tab. Where the
bug needs new values (a rounded-down bound, a reciprocal) they are inserted next to the anchor.
"""

from __future__ import annotations

from .spec import PlantedCase, TextEdit

CUDA = "cuda:90"
HIP = "hip:gfx942"

_WRONG: list[PlantedCase] = [
    # ---- TTIR: the CPU interpreter runs both versions on the same launch ------------------------------
    PlantedCase(
        "ttir-mask-off-by-one", "layernorm_fwd", CUDA, "ttir", False, "cpu",
        "column mask `cols < n_cols` becomes `cols <= n_cols`: the mean and variance take in the next "
        "row's first element", (TextEdit("arith.cmpi slt, %cols, %mask :", "arith.cmpi sle, %cols, %mask :"),),
        kind="off-by-one mask"),
    PlantedCase(
        "ttir-swapped-subf", "softmax_onepass", CUDA, "ttir", False, "cpu",
        "`x - max` becomes `max - x` before the exponential",
        (TextEdit("arith.subf %x_7, %e_8 :", "arith.subf %e_8, %x_7 :"),), kind="swapped operands"),
    PlantedCase(
        "ttir-sum-identity", "row_sum_bf16", CUDA, "ttir", False, "cpu",
        "masked-off lanes load 1.0 instead of the sum's identity 0.0 (the last block adds 24)",
        (TextEdit("%cst = arith.constant dense<0.000000e+00> : tensor<256xbf16>",
                  "%cst = arith.constant dense<1.000000e+00> : tensor<256xbf16>"),),
        kind="wrong reduction identity"),
    PlantedCase(
        "ttir-wrong-stride", "matmul_fp16", CUDA, "ttir", False, "cpu",
        "A's row stride is taken from C's (`stride_cm`, 144) instead of `stride_am` (112)",
        (TextEdit("tt.splat %stride_am : i32 -> tensor<64x1xi32>", "tt.splat %stride_cm : i32 -> tensor<64x1xi32>"),),
        kind="wrong stride"),
    PlantedCase(
        "ttir-dropped-tail", "vector_add", CUDA, "ttir", False, "cpu",
        "the bound is rounded down to a multiple of the block (`n & -1024`): the partial last block is "
        "never written",
        (TextEdit("%mask = tt.splat %n : i32 -> tensor<1024xi32>",
                  "%cm1024_i32 = arith.constant -1024 : i32\n"
                  "    %n_full = arith.andi %n, %cm1024_i32 : i32\n"
                  "    %mask = tt.splat %n_full : i32 -> tensor<1024xi32>"),),
        kind="dropped tail"),
    PlantedCase(
        "ttir-max-combiner", "row_max", CUDA, "ttir", False, "cpu",
        "the row reduction combines with `minnumf` instead of `maxnumf`",
        (TextEdit("arith.maxnumf", "arith.minnumf"),), kind="wrong reduction combiner"),
    PlantedCase(
        "ttir-unsigned-compare", "clamp_where_i32", HIP, "ttir", False, "cpu",
        "`x < lo` is compared unsigned: negative values are no longer clamped up to `lo`",
        (TextEdit("arith.cmpi slt, %x_7, %y :", "arith.cmpi ult, %x_7, %y :"),), kind="wrong predicate"),
    PlantedCase(
        "ttir-reciprocal-division", "layernorm_fwd", CUDA, "ttir", False, "cpu",
        "fast-math where not allowed: the mean `sum / n` becomes `sum * (1 / n)` (arcp), which rounds "
        "differently",
        (TextEdit("%mean_7 = arith.divf %mean, %mean_6 : f32",
                  "%c1_f32 = arith.constant 1.000000e+00 : f32\n"
                  "    %inv_n = arith.divf %c1_f32, %mean_6 : f32\n"
                  "    %mean_7 = arith.mulf %mean, %inv_n : f32"),), kind="fast-math"),
    PlantedCase(
        "ttir-tf32-dot", "matmul_fp32_ieee", CUDA, "ttir", False, "cpu",
        "fast-math where not allowed: an IEEE fp32 dot runs on TF32 tensor cores (inputs rounded to 10 "
        "mantissa bits; the interpreter models the input precision)",
        (TextEdit("tt.dot %a_50, %b_54, %acc_44 :", "tt.dot %a_50, %b_54, %acc_44, inputPrecision = tf32 :"),),
        kind="fast-math"),
    # ---- TTGIR ------------------------------------------------------------------------------------------
    PlantedCase(
        "ttgir-swapped-subf", "layernorm_fwd", CUDA, "ttgir", False, "cpu",
        "the centred value `x - mean` becomes `mean - x` (the variance is unchanged, the output negated)",
        (TextEdit("arith.subf %x_8, %xc :", "arith.subf %xc, %x_8 :"),), kind="swapped operands"),
    PlantedCase(
        "ttgir-scan-identity", "cumsum_carry_i32", CUDA, "ttgir", False, "cpu",
        "the running carry of the scan starts at 1 instead of 0",
        (TextEdit("iter_args(%carry_3 = %c0_i32)", "iter_args(%carry_3 = %c1_i32)"),
         TextEdit("%c0_i32 = arith.constant 0 : i32",
                  "%c1_i32 = arith.constant 1 : i32\n    %c0_i32 = arith.constant 0 : i32")),
        kind="wrong reduction identity"),
    PlantedCase(
        "ttgir-sum-identity", "col_sum_i32", CUDA, "ttgir", False, "cpu",
        "the accumulator and the masked-off lanes start at 1 instead of the sum's identity 0",
        (TextEdit("%cst = arith.constant dense<0> : tensor<32x16xi32, #blocked>",
                  "%cst = arith.constant dense<1> : tensor<32x16xi32, #blocked>"),), kind="wrong reduction identity"),
    PlantedCase(
        "ttgir-mask-off-by-one", "softmax_online", CUDA, "ttgir", False, "cpu",
        "the first pass's mask `< n_cols` becomes `<= n_cols`: max and sum take in the next row's first "
        "element", (TextEdit("arith.cmpi slt, %mask_8, %mask :", "arith.cmpi sle, %mask_8, %mask :"),),
        kind="off-by-one mask"),
    PlantedCase(
        "ttgir-dropped-tail", "row_sum_bf16", CUDA, "ttgir", False, "cpu",
        "the loop runs to `n_cols - 255`: the last partial block of each row is not summed",
        (TextEdit("scf.for %start = %c0_i32 to %n_cols step %c256_i32",
                  "scf.for %start = %c0_i32 to %n_full step %c256_i32"),
         TextEdit("%c256_i32 = arith.constant 256 : i32",
                  "%c256_i32 = arith.constant 256 : i32\n    %c255_i32 = arith.constant 255 : i32\n"
                  "    %n_full = arith.subi %n_cols, %c255_i32 : i32")),
        kind="dropped tail"),
    PlantedCase(
        "ttgir-wrong-stride", "col_sum_i32", CUDA, "ttgir", False, "cpu",
        "rows are addressed with stride `n_rows` instead of `n_cols`",
        (TextEdit("%acc = tt.splat %n_cols : i32 -> tensor<32x1xi32, #blocked>",
                  "%acc = tt.splat %n_rows : i32 -> tensor<32x1xi32, #blocked>"),), kind="wrong stride"),
    # ---- LLVM IR: no CPU semantics; the GPU differential run, or a static ABI check -----------------------
    PlantedCase(
        "llir-reassociated-sum", "layernorm_fwd", CUDA, "llir", False, "gpu",
        "fast-math where not allowed: each thread's sum of its four elements `((a + b) + c) + d` is "
        "reassociated to `(a + b) + (c + d)`",
        (TextEdit("  %foldExtExtBinop3 = fadd <4 x float> %foldExtExtBinop, %shift2, !dbg !22\n", ""),
         TextEdit("%foldExtExtBinop6 = fadd <4 x float> %foldExtExtBinop3, %shift5, !dbg !22",
                  "%pair = fadd <4 x float> %shift2, %shift5, !dbg !22\n"
                  "  %foldExtExtBinop6 = fadd <4 x float> %foldExtExtBinop, %pair, !dbg !22")),
        kind="fast-math"),
    PlantedCase(
        "llir-dropped-barrier", "row_max", CUDA, "llir", False, "gpu",
        "the barrier between the warps' partial maxima in shared memory and their read-back is removed",
        (TextEdit(r"(i1 %62\) #4, !dbg !19\n)  tail call void @llvm\.nvvm\.barrier\.cta\.sync\.aligned\.all\(i32 0\), "
                  r"!dbg !19\n", r"\1", regex=True),), kind="dropped barrier", gpu_sanitizer="racecheck"),
    PlantedCase(
        "llir-mask-off-by-one", "layernorm_fwd", CUDA, "llir", False, "gpu",
        "the load mask `icmp slt` becomes `icmp sle`: the row's statistics take in one element too many",
        (TextEdit("%38 = icmp slt <4 x i32> %35, %37", "%38 = icmp sle <4 x i32> %35, %37"),), kind="off-by-one mask"),
    PlantedCase(
        "llir-swapped-fsub", "softmax_onepass", CUDA, "llir", False, "gpu",
        "`x - max` becomes `max - x` for one of each thread's elements",
        (TextEdit("%81 = fsub float %32, %80", "%81 = fsub float %80, %32"),), kind="swapped operands"),
    PlantedCase(
        "llir-dropped-tail", "vector_add", CUDA, "llir", False, "gpu",
        "the bound is rounded down to a multiple of the block: the partial last block is never written",
        (TextEdit("%20 = icmp slt i32 %12, %3,", "%n_full = and i32 %3, -1024\n  %20 = icmp slt i32 %12, %n_full,"),
         TextEdit(r"icmp slt i32 (%1[3-9]), %3,", r"icmp slt i32 \1, %n_full,", count=7, regex=True)),
        kind="dropped tail"),
    PlantedCase(
        "llir-extra-parameter", "row_max", CUDA, "llir", False, "static",
        "an extra i32 parameter is added to the kernel: the launcher's argument layout no longer fits",
        (TextEdit("ptr addrspace(1) readnone captures(none) %4) local_unnamed_addr",
                  "ptr addrspace(1) readnone captures(none) %4, i32 %extra) local_unnamed_addr"),), kind="ABI change"),
    PlantedCase(
        "llir-block-size", "vector_add", CUDA, "llir", False, "static",
        "the kernel is declared for 256 threads per block while Triton launches 128",
        (TextEdit('"nvvm.reqntid"="128"', '"nvvm.reqntid"="256"'),), kind="ABI change"),
    # ---- PTX ---------------------------------------------------------------------------------------------
    PlantedCase(
        "ptx-wrong-predicate", "softmax_onepass", CUDA, "ptx", False, "gpu",
        "the mask of the third element group compares `le` instead of `lt`: column 300 (the next row) is "
        "loaded and stored", (TextEdit("\tsetp.lt.s32 \t%p3, %r24, %r19;", "\tsetp.le.s32 \t%p3, %r24, %r19;"),),
        kind="wrong predicate"),
    PlantedCase(
        "ptx-dropped-barrier", "row_max", CUDA, "ptx", False, "gpu",
        "the `bar.sync` between the warps' partial maxima in shared memory and their read-back is removed",
        (TextEdit(r"(@%p5 st\.shared\.b32 \[ %r6 \+ 0 \], %r7;\n\t// end inline asm\n)\tbar\.sync \t0;\n", r"\1",
                  regex=True),), kind="dropped barrier", gpu_sanitizer="racecheck"),
    PlantedCase(
        "ptx-reassociated-sum", "layernorm_fwd", CUDA, "ptx", False, "gpu",
        "fast-math where not allowed: each thread's partial sum `((a + b) + c) + d` is reassociated to "
        "`((c + d) + b) + a`",
        (TextEdit("\tadd.f32 \t%r43, %r3, %r1;\n\tadd.f32 \t%r44, %r43, %r4;\n\tadd.f32 \t%r45, %r44, %r5;\n",
                  "\tadd.f32 \t%r43, %r4, %r5;\n\tadd.f32 \t%r44, %r43, %r1;\n\tadd.f32 \t%r45, %r44, %r3;\n"),),
        kind="fast-math"),
    PlantedCase(
        "ptx-wrong-stride", "row_max", CUDA, "ptx", False, "gpu",
        "the row offset is scaled by 8 bytes instead of 4: row r reads row 2r",
        (TextEdit("\tshl.b64 \t%rd11, %rd10, 2;", "\tshl.b64 \t%rd11, %rd10, 3;"),), kind="wrong stride"),
    PlantedCase(
        "ptx-swapped-sub", "softmax_onepass", CUDA, "ptx", False, "gpu",
        "`x - max` becomes `max - x` for the first element of each thread",
        (TextEdit("\tsub.f32 \t%r47, %r1, %r46;", "\tsub.f32 \t%r47, %r46, %r1;"),), kind="swapped operands"),
    PlantedCase(
        "ptx-block-size", "row_max", CUDA, "ptx", False, "static",
        "`.reqntid 128` becomes 256: the launch bounds no longer match Triton's launch",
        (TextEdit(".reqntid 128", ".reqntid 256"),), kind="ABI change"),
    # ---- issue 20: the holes a differential run alone left open ------------------------------------------
    PlantedCase(
        "ptx-stale-cubin", "softmax_onepass", CUDA, "ptx", False, "gpu",
        "`x - max` becomes `x + max` (`sub.f32` -> `add.f32`) in the PTX of an entry whose cubin is still "
        "Triton's: the binaries are identical unless verify rebuilds the cubin from the PTX",
        (TextEdit("\tsub.f32 \t%r47, %r1, %r46;", "\tadd.f32 \t%r47, %r1, %r46;"),), kind="stale lower level",
        stale=True),
    PlantedCase(
        "llir-stale-lower-levels", "softmax_onepass", CUDA, "llir", False, "gpu",
        "`x - max` becomes `max - x` in the LLVM IR of an entry whose PTX and cubin are still Triton's",
        (TextEdit("%81 = fsub float %32, %80", "%81 = fsub float %80, %32"),), kind="stale lower level", stale=True),
    PlantedCase(
        "ptx-one-past-end-write", "row_scale", CUDA, "ptx", False, "gpu",
        "the row mask `setp.lt.s32` becomes `setp.le.s32`: every program reads and writes one element past its "
        "row; the next row's program overwrites the stray element with the right value, and the last row's "
        "lands past the end of the buffer, where only a redzone sees it",
        (TextEdit("\tsetp.lt.s32 \t%p1, %r4, %r2;", "\tsetp.le.s32 \t%p1, %r4, %r2;"),),
        kind="one-past-the-end write"),
    PlantedCase(
        "ttir-one-past-end-write", "row_scale", CUDA, "ttir", False, "cpu",
        "the row mask `cols < n_cols` becomes `cols <= n_cols`: the stray writes land on the next row's first "
        "element (with its right value) and, for the last row, past the end: the interpreter's redzones see it",
        (TextEdit("arith.cmpi slt, %cols, %mask :", "arith.cmpi sle, %cols, %mask :"),),
        kind="one-past-the-end write"),
    PlantedCase(
        "ptx-read-past-end", "row_scale", CUDA, "ptx", False, "gpu",
        "the load (only) gets a widened predicate `col <= n_cols`: the last row reads one element past the end "
        "of x; the value is never stored, so the outputs are right and only memcheck (on buffers in their own "
        "allocations) sees it",
        (TextEdit("\t.reg .pred \t%p<2>;", "\t.reg .pred \t%p<3>;"),
         TextEdit("\tsetp.lt.s32 \t%p1, %r4, %r2;", "\tsetp.lt.s32 \t%p1, %r4, %r2;\n\tsetp.le.s32 \t%p2, %r4, %r2;"),
         TextEdit("@%p1 ld.global.b16", "@%p2 ld.global.b16")),
        kind="read past the end"),
    PlantedCase(
        "ptx-i32-offset-overflow", "row_scale", CUDA, "ptx", False, "gpu",
        "the row offset `row * n_cols` is computed in 32 bits and sign-extended: equal on every launch below "
        "2^31 elements, wrapped to a negative offset on a launch of 21474850 rows of 100 (2^31 + 1352 elements)",
        (TextEdit("\t.reg .b32 \t%r<7>;", "\t.reg .b32 \t%r<8>;"),
         TextEdit("\tmul.lo.s64 \t%rd7, %rd6, %rd5;", "\tmul.lo.s32 \t%r7, %r2, %r1;\n\tcvt.s64.s32 \t%rd7, %r7;")),
        kind="i32 address overflow", large_rows=21474850),
    PlantedCase(
        "amdgcn-one-past-end-write", "row_scale", HIP, "amdgcn", False, "amd-gpu",
        "the row mask `n_cols > col` becomes `n_cols >= col`: one element past each row is read and written",
        (TextEdit("\tv_cmp_gt_i32_e32 vcc, s6, v1\n", "\tv_cmp_ge_i32_e32 vcc, s6, v1\n"),),
        kind="one-past-the-end write"),
    PlantedCase(
        "amdgcn-i32-offset-overflow", "row_scale", HIP, "amdgcn", False, "amd-gpu",
        "the 64-bit row offset's high word becomes the sign of the 32-bit product (`row * n_cols` in 32 bits)",
        (TextEdit("\ts_mul_hi_i32 s1, s6, s12\n\ts_mul_i32 s0, s6, s12\n",
                  "\ts_mul_i32 s0, s6, s12\n\ts_ashr_i32 s1, s0, 31\n"),), kind="i32 address overflow"),
    # ---- AMDGCN: no AMD GPU; the waitcnt hazard check and the code-object checks are static ---------------
    PlantedCase(
        "amdgcn-removed-vmcnt", "row_max", HIP, "amdgcn", False, "static",
        "the `s_waitcnt vmcnt(1)` before the first loaded value is used is removed",
        (TextEdit("\ts_waitcnt vmcnt(1)\n\tv_cndmask_b32_e32 v3, v1, v3, vcc\n", "\tv_cndmask_b32_e32 v3, v1, v3, vcc\n"),),
        kind="removed s_waitcnt"),
    PlantedCase(
        "amdgcn-removed-lgkmcnt-smem", "vector_add", HIP, "amdgcn", False, "static",
        "the `s_waitcnt lgkmcnt(0)` after the kernel-argument loads is removed",
        (TextEdit("\ts_waitcnt lgkmcnt(0)\n\ts_branch .LBB0_0\n", "\ts_branch .LBB0_0\n"),), kind="removed s_waitcnt"),
    PlantedCase(
        "amdgcn-removed-lgkmcnt-lds", "row_max", HIP, "amdgcn", False, "static",
        "the `s_waitcnt lgkmcnt(0)` between the LDS read of the partial maxima and its use is removed",
        (TextEdit("\ts_waitcnt lgkmcnt(0)\n\tv_max_f32_e32 v3, v2, v2\n", "\tv_max_f32_e32 v3, v2, v2\n"),),
        kind="removed s_waitcnt"),
    PlantedCase(
        "amdgcn-weakened-vmcnt", "layernorm_fwd", HIP, "amdgcn", False, "static",
        "`s_waitcnt vmcnt(0)` becomes `vmcnt(1)`: the second of two loads may still be outstanding",
        (TextEdit("\ts_waitcnt vmcnt(0)\n\tv_add_f32_e32 v6, v7, v8\n", "\ts_waitcnt vmcnt(1)\n\tv_add_f32_e32 v6, v7, v8\n"),),
        kind="removed s_waitcnt"),
    PlantedCase(
        "amdgcn-kernarg-size", "vector_add", HIP, "amdgcn", False, "static",
        "the code object declares the `n` argument 8 bytes wide: the kernarg layout changed",
        (TextEdit("      - .offset:         24\n        .size:           4\n",
                  "      - .offset:         24\n        .size:           8\n"),), kind="ABI change"),
    PlantedCase(
        "amdgcn-dropped-barrier", "row_max", HIP, "amdgcn", False, "amd-gpu",
        "the `s_barrier` between the waves' partial maxima in LDS and their read-back is removed (a race "
        "only an AMD GPU run shows)",
        (TextEdit(r"\ts_barrier\n(\ts_and_saveexec_b64 s\[2:3\], s\[0:1\]\n)", r"\1", regex=True),),
        kind="dropped barrier"),
    PlantedCase(
        "amdgcn-wrong-predicate", "row_max", HIP, "amdgcn", False, "amd-gpu",
        "the column mask compares `ge` instead of `gt` (`n_cols > col` becomes `n_cols >= col`)",
        (TextEdit("\tv_cmp_gt_i32_e32 vcc, s6, v0\n", "\tv_cmp_ge_i32_e32 vcc, s6, v0\n"),), kind="wrong predicate"),
    PlantedCase(
        "amdgcn-swapped-sub", "softmax_onepass", HIP, "amdgcn", False, "amd-gpu",
        "`x - max` becomes `max - x` for one element (`v_sub_f32` operands swapped)",
        (TextEdit("\tv_sub_f32_e32 v5, v5, v0\n", "\tv_subrev_f32_e32 v5, v5, v0\n"),), kind="swapped operands"),
]

_CORRECT: list[PlantedCase] = [
    PlantedCase("ok-ptx-cache-hints", "softmax_online", CUDA, "ptx", True, "gpu",
                "the project's cache-hints pass", pipeline="ptx(cache-hints)", kind="pass"),
    PlantedCase("ok-ptx-ld-nc", "vector_add", CUDA, "ptx", True, "gpu",
                "the project's ld-nc pass (read-only loads; the suite's buffers do not overlap)",
                pipeline="ptx(ld-nc{assume_noalias=true})", kind="pass"),
    PlantedCase("ok-llir-noalias", "layernorm_fwd", CUDA, "llir", True, "cpu",
                "the project's noalias-args pass (here only the LLVM IR changes: Triton's loads are inline asm, "
                "so the rebuilt cubin is byte-identical, evidence without a GPU)",
                pipeline="llir(noalias-args{assume=true})", kind="pass"),
    PlantedCase("ok-ttir-load-eviction", "row_sum_bf16", CUDA, "ttir", True, "cpu",
                "the project's load-eviction pass", pipeline="ttir(load-eviction)", kind="pass"),
    PlantedCase("ok-ttgir-num-stages", "matmul_fp16", CUDA, "ttgir", True, "cpu",
                "the project's num-stages pass (two pipeline stages instead of three)",
                pipeline="ttgir(num-stages{n=2})", kind="pass"),
    PlantedCase("ok-amdgcn-nontemporal", "vector_add", HIP, "amdgcn", True, "static",
                "the project's nontemporal-hints pass", pipeline="amdgcn(nontemporal-hints)", kind="pass"),
    PlantedCase("ok-amdgcn-mfma-priority", "bmm_fp16_bt", HIP, "amdgcn", True, "static",
                "the project's mfma-priority pass (Triton sets no priority in this kernel)", pipeline="amdgcn(mfma-priority)", kind="pass"),
    PlantedCase("ok-ttir-commuted-addi", "col_sum_i32", CUDA, "ttir", True, "cpu",
                "the operands of the (commutative, exact) integer sum's combiner are swapped",
                (TextEdit("arith.addi %arg4, %arg5 : i32", "arith.addi %arg5, %arg4 : i32"),), kind="commuted operands"),
    PlantedCase("ok-ttir-rename", "layernorm_fwd", CUDA, "ttir", True, "cpu",
                "the SSA value `%mean_7` is renamed `%row_mean` everywhere",
                (TextEdit(r"%mean_7\b", "%row_mean", count=3, regex=True),), kind="renaming"),
    PlantedCase("ok-ttgir-rename", "layernorm_fwd", CUDA, "ttgir", True, "cpu",
                "the SSA value `%xc_11` is renamed `%centered` everywhere",
                (TextEdit(r"%xc_11\b", "%centered", count=2, regex=True),), kind="renaming"),
    PlantedCase("ok-llir-commuted-fadd", "vector_add", CUDA, "llir", True, "gpu",
                "the operands of one fp32 addition are swapped (IEEE addition is commutative)",
                (TextEdit("%92 = fadd float %45, %69", "%92 = fadd float %69, %45"),), kind="commuted operands"),
    PlantedCase("ok-ptx-row-scale-cache-hints", "row_scale", CUDA, "ptx", True, "gpu",
                "the project's cache-hints pass on the row-wise kernel the overrun cases use",
                pipeline="ptx(cache-hints)", kind="pass"),
    PlantedCase("ok-ptx-reorder", "row_max", CUDA, "ptx", True, "gpu",
                "two independent `or.b32` instructions are swapped",
                (TextEdit("\tor.b32 \t%r17, %r15, 128;\n\tor.b32 \t%r18, %r15, 256;\n",
                          "\tor.b32 \t%r18, %r15, 256;\n\tor.b32 \t%r17, %r15, 128;\n"),), kind="reordering"),
    PlantedCase("ok-amdgcn-extra-waitcnt", "row_max", HIP, "amdgcn", True, "static",
                "a stronger wait (`s_waitcnt vmcnt(0)`) right after the two loads: slower, still correct",
                (TextEdit("\tbuffer_load_dword v4, v1, s[8:11], 0 offen\n",
                          "\tbuffer_load_dword v4, v1, s[8:11], 0 offen\n\ts_waitcnt vmcnt(0)\n"),), kind="stronger wait"),
    PlantedCase("ok-amdgcn-reorder", "row_max", HIP, "amdgcn", True, "static",
                "two independent VALU instructions are swapped",
                (TextEdit("\tv_lshlrev_b32_e32 v2, 2, v0\n\tv_bfrev_b32_e32 v3, 1\n",
                          "\tv_bfrev_b32_e32 v3, 1\n\tv_lshlrev_b32_e32 v2, 2, v0\n"),), kind="reordering"),
]

CASES: tuple[PlantedCase, ...] = (*_WRONG, *_CORRECT)


def get_case(name: str) -> PlantedCase:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no planted case {name!r}; known: {', '.join(c.name for c in CASES)}")
