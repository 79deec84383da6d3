
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton.jit
def _triton_helper_fn_add0(arg0_0, arg1_0):
    tmp0 = arg0_0 + arg1_0
    return tmp0

@triton_heuristics.persistent_reduction(
    size_hints={'x': 16, 'r0_': 1024},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_out_ptr1': '*fp32', 'in_out_ptr2': '*fp32', 'in_ptr0': '*fp32', 'in_ptr1': '*i64', 'out_ptr0': '*fp32', 'out_ptr1': '*fp32', 'out_ptr2': '*i64', 'out_ptr3': '*fp32', 'load_seed_offset': 'i32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused_amax_argmax_cumsum_logsumexp_native_dropout_sum_var_mean_0', 'mutated_arg_names': ['in_out_ptr0', 'in_out_ptr1', 'in_out_ptr2'], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 7, 'num_reduction': 8, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 768, 'r0_': 320000}}
)
@triton.jit
def triton_per_fused_amax_argmax_cumsum_logsumexp_native_dropout_sum_var_mean_0(in_out_ptr0, in_out_ptr1, in_out_ptr2, in_ptr0, in_ptr1, out_ptr0, out_ptr1, out_ptr2, out_ptr3, load_seed_offset, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 16
    r0_numel = 1000
    R0_BLOCK: tl.constexpr = 1024
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = r0_index < r0_numel
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 1000*x0), r0_mask & xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(r0_mask & xmask, tmp1, 0)
    tmp4 = tl.broadcast_to(tmp1, [XBLOCK, R0_BLOCK])
    tmp6 = tl.where(r0_mask & xmask, tmp4, 0)
    tmp7 = tl.sum(tmp6, 1)[:, None].to(tl.float32)
    tmp8 = tl.full([1, 1], 1000, tl.int32)
    tmp9 = tmp8.to(tl.float32)
    tmp10 = (tmp7 / tmp9)
    tmp11 = tmp1 - tmp10
    tmp12 = tmp11 * tmp11
    tmp13 = tl.broadcast_to(tmp12, [XBLOCK, R0_BLOCK])
    tmp15 = tl.where(r0_mask & xmask, tmp13, 0)
    tmp16 = tl.sum(tmp15, 1)[:, None].to(tl.float32)
    tmp18 = tl.sum(tmp3, 1)[:, None].to(tl.float32)
    tmp20 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
    tmp21 = triton_helpers.max2(tmp20, 1)[:, None].to(tl.float32)
    tmp23 = tl.broadcast_to(rindex, tmp20.shape)
    tmp22_val, tmp22_idx = triton_helpers.max_with_index(tmp20, tmp23, 1)
    tmp22 = tmp22_idx[:, None]
    tmp24 = tmp0.to(tl.float32)
    tmp25 = tl.broadcast_to(tmp24, [XBLOCK, R0_BLOCK])
    tmp26, = tl.associative_scan((tmp25,), 1, _triton_helper_fn_add0)
    tmp27 = tl_math.abs(tmp21)
    tmp28 = tl.full([1, 1], float("inf"), tl.float32)
    tmp29 = tmp27 == tmp28
    tmp30 = tl.full([1, 1], 0.0, tl.float32)
    tmp31 = tl.where(tmp29, tmp30, tmp21)
    tmp32 = tmp0 - tmp31
    tmp33 = libdevice.exp(tmp32)
    tmp34 = tl.broadcast_to(tmp33, [XBLOCK, R0_BLOCK])
    tmp36 = tl.where(r0_mask & xmask, tmp34, 0)
    tmp37 = tl.sum(tmp36, 1)[:, None].to(tl.float32)
    tmp38 = tl.load(in_ptr1 + load_seed_offset)
    tmp39 = r0_1 + 1000*x0
    tmp40 = tl.rand(tmp38, (tmp39).to(tl.uint32))
    tmp41 = tl.full([1, 1], 0.1, tl.float32)
    tmp42 = tmp40 > tmp41
    tmp43 = tmp42.to(tl.float32)
    tmp44 = tmp43 * tmp0
    tmp45 = tl.full([1, 1], 1.1111111111111112, tl.float32)
    tmp46 = tmp44 * tmp45
    tmp47 = tl_math.log(tmp37)
    tmp48 = tmp47 + tmp31
    tmp49 = tl.full([1, 1], 999.0, tl.float32)
    tmp50 = (tmp16 / tmp49)
    tl.store(out_ptr3 + (r0_1 + 1000*x0), tmp26, r0_mask & xmask)
    tl.store(in_out_ptr0 + (r0_1 + 1000*x0), tmp46, r0_mask & xmask)
    tl.debug_barrier()
    tl.store(in_out_ptr1 + (x0), tmp48, xmask)
    tl.debug_barrier()
    tl.store(in_out_ptr2 + (x0), tmp50, xmask)
    tmp22 = tmp22.to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp18, xmask)
    tl.store(out_ptr1 + (x0), tmp21, xmask)
    tl.store(out_ptr2 + (x0), tmp22, xmask)
