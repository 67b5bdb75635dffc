//! A decode step of the recurrent ops allocates nothing once the thread's scratch has grown: a
//! counting global allocator sees no allocation over many one-row calls of the delta rule (both
//! gates) and the causal conv. (Its own binary, so no other test's allocations are counted; the
//! calls run on this thread, whose own allocations are what is counted, so that the harness's
//! threads cannot disturb the count.)

mod alloc_common;

use bloomery_kernels_cpu::linear::Serial;
use bloomery_kernels_cpu::ops::conv::{conv_causal, ConvParams};
use bloomery_kernels_cpu::ops::delta_rule::{delta_rule, DeltaRuleInputs, DeltaRuleParams, Form};

#[test]
fn one_row_steps_do_not_allocate() {
    let (hk, hv, dk, dv) = (2, 4, 32, 32);
    let p = DeltaRuleParams {
        n_head_k: hk,
        n_head_v: hv,
        dk,
        dv,
        n_slots: 2,
        scale: 0.2,
        beta_scale: 1.0,
        per_dim_gate: false,
        form: Form::Auto,
    };
    let per_dim = DeltaRuleParams {
        per_dim_gate: true,
        ..p
    };
    let (q, k) = (vec![0.1f32; dk * hk], vec![0.05f32; dk * hk]);
    let (v, beta) = (vec![0.5f32; dv * hv], vec![0.5f32; hv]);
    let (gate, gates) = (vec![-0.1f32; hv], vec![-0.1f32; dk * hv]);
    let mut state = vec![0f32; dk * dv * hv * 2];
    let mut out = vec![0f32; dv * hv];
    let conv = ConvParams {
        ch: 600,
        taps: 4,
        dilation: 1,
        n_slots: 2,
    };
    let (x, w) = (vec![0.25f32; conv.ch], vec![0.5f32; conv.ch * conv.taps]);
    let mut conv_state = vec![0f32; conv.ch * 3 * 2];
    let mut conv_out = vec![0f32; conv.ch];
    let mut step = |pos: i32| {
        for (params, gate) in [(&p, &gate), (&per_dim, &gates)] {
            let x = DeltaRuleInputs {
                q: &q,
                k: &k,
                v: &v,
                gate,
                beta: &beta,
                slots: &[1],
                positions: &[pos],
            };
            delta_rule(&Serial, &x, params, &mut state, &mut out).unwrap();
        }
        conv_causal(
            &Serial,
            &x,
            &w,
            &mut conv_state,
            &[1],
            &[pos],
            &conv,
            &mut conv_out,
        )
        .unwrap();
    };
    step(0);
    let before = alloc_common::thread_allocations();
    for pos in 1..200 {
        step(pos);
    }
    assert_eq!(
        alloc_common::thread_allocations() - before,
        0,
        "a decode step allocated"
    );
    assert!(out.iter().all(|v| v.is_finite()) && conv_out.iter().all(|v| v.is_finite()));
}
