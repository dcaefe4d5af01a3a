"""muonrt.Muon's argument and tensor errors: torch.optim.Muon's messages for
its arguments, clear errors naming the parameter for the rest."""
import re

import pytest
import torch

import muonrt

pytestmark = pytest.mark.usefixtures("lib")


def named(*shapes, dtype=torch.float32):
    return [(f"w{i}", torch.nn.Parameter(torch.randn(s).to(dtype)))
            for i, s in enumerate(shapes)]


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": -0.1}, "Learning rate should be >= 0 but is: -0.1"),
    ({"lr": float("nan")}, "Learning rate should be >= 0 but is: nan"),
    ({"momentum": -0.5}, "momentum should be >= 0 but is: -0.5"),
    ({"weight_decay": -1.0}, "weight decay should be >= 0 but is: -1.0"),
    ({"adjust_lr_fn": "bogus"},
     "Adjust learning rate function bogus is not supported"),
    ({"ns_steps": 100},
     "Number of steps must be less than 100 for computational efficiency"),
    ({"ns_coefficients": (1.0, 2.0)},
     "Coefficients must be a tuple of exactly 3 values"),
    ({"lr": torch.tensor([0.1, 0.2])}, "Tensor lr must be 1-element"),
    # The runtime's options, checked by the same library call.
    ({"prefetch_count": -1}, "execution.prefetch_count is -1; must be >= 0"),
    ({"replan_every_steps": -2},
     "execution.replan_every_steps is -2; must be >= 0"),
    ({"assignment_policy": "fastest"},
     'execution.assignment_policy "fastest" is not a policy'),
    ({"ns_schedule": "cubic"}, 'ns_schedule "cubic" is not supported'),
    ({"exchange_dtype": "float16"},
     'execution.exchange_dtype "float16" is not an exchange dtype'),
    ({"normuon": True, "normuon_beta2": 1.0},
     "normuon_beta2 should be in [0, 1) but is: 1.0"),
    ({"normuon": True, "normuon_eps": 0.0},
     "normuon_eps should be a finite value > 0 but is: 0.0"),
    ({"gpu_precision": "fp64"},
     'execution.gpu_precision "fp64" is not supported (use "bf16", "tf32" '
     'or "fp32")'),
])
def test_torch_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        muonrt.Muon(named((4, 4)), **kwargs)


def test_empty_parameter_list():
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        muonrt.Muon([])


@pytest.mark.parametrize("shape", [(8,), (2, 3, 4), ()])
def test_non_2d_parameter_torch_message_and_name(shape):
    params = named((4, 4)) + [("bias", torch.nn.Parameter(torch.randn(shape)))]
    msg = ("Muon only supports 2D parameters whereas we found a parameter "
           f"with size: {torch.Size(shape)} (parameter 'bias')")
    with pytest.raises(ValueError, match=re.escape(msg)):
        muonrt.Muon(params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32])
def test_unsupported_dtype_names_parameter(dtype):
    p = torch.zeros(4, 4, dtype=dtype)
    with pytest.raises(TypeError, match=r"parameter 'w' is torch\.") as e:
        muonrt.Muon([("w", p)])
    assert "float32 and bfloat16" in str(e.value)


def test_non_contiguous_parameter_names_it():
    base = torch.randn(6, 4)
    p = base.T  # (4, 6), strides (1, 4)
    with pytest.raises(ValueError, match=r"parameter 'w_t' is not contiguous"):
        muonrt.Muon([("ok", torch.randn(3, 3)), ("w_t", p)])


def test_parameter_on_another_device_kind_raises_naming_it():
    p = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    with pytest.raises(ValueError, match=r"'w_meta' is on meta; CPU and "
                                         r"CUDA tensors only"):
        muonrt.Muon([("w_meta", p)])


def test_cpu_and_cuda_parameters_in_one_optimizer_raise_naming_both():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (mixing devices needs one)")
    a = torch.nn.Parameter(torch.randn(4, 4))
    b = torch.nn.Parameter(torch.randn(4, 4, device="cuda"))
    with pytest.raises(ValueError, match=r'"a" is on cpu but parameter "b" '
                                         r'is on cuda:0'):
        muonrt.Muon([("a", a), ("b", b)])


def test_missing_grad_raises_naming_parameter_and_modifies_nothing():
    params = named((4, 4), (6, 3))
    opt = muonrt.Muon(params, lr=0.1)
    params[0][1].grad = torch.randn(4, 4)
    before = [p.detach().clone() for _, p in params]
    with pytest.raises(RuntimeError,
                       match=r"parameter 'w1' has no gradient \(grad is None\)"):
        opt.step()
    for (_, p), b in zip(params, before):
        assert torch.equal(p.detach(), b)
    assert opt.step_count == 0
    params[1][1].grad = torch.randn(6, 3)
    opt.step()
    assert opt.step_count == 1


def test_non_contiguous_grad_names_parameter():
    # (torch itself refuses .grad of another size or dtype.)
    params = named((4, 4))
    opt = muonrt.Muon(params)
    params[0][1].grad = torch.randn(4, 8)[:, ::2]
    with pytest.raises(RuntimeError, match=r"gradient of 'w0' is not contiguous"):
        opt.step()


def test_parameter_storage_replaced_is_detected():
    params = named((4, 4))
    opt = muonrt.Muon(params)
    params[0][1].data = torch.randn(4, 4)
    params[0][1].grad = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match=r"parameter 'w0' moved"):
        opt.step()


def test_global_option_per_group_is_rejected():
    a, b = named((4, 4), (4, 4))
    with pytest.raises(ValueError, match=r"param group 1 sets nesterov=False"):
        muonrt.Muon([{"params": [a]}, {"params": [b], "nesterov": False}])


def test_changing_a_global_option_after_construction_is_rejected():
    params = named((4, 4))
    opt = muonrt.Muon(params)
    opt.param_groups[0]["nesterov"] = False
    params[0][1].grad = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match=r"nesterov changed to False"):
        opt.step()


def test_negative_group_lr_is_rejected_by_the_library():
    params = named((4, 4))
    opt = muonrt.Muon(params)
    opt.param_groups[0]["lr"] = -1.0
    params[0][1].grad = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"-1"):
        opt.step()


def test_group_hyperparameter_not_a_number_names_group_and_key():
    params = named((4, 4), (4, 4))
    opt = muonrt.Muon([{"params": [params[0]]}, {"params": [params[1]]}])
    for _, p in params:
        p.grad = torch.randn(4, 4)
    before = [p.detach().clone() for _, p in params]
    for key, value in (("lr", "abc"), ("weight_decay", None),
                       ("momentum", [0.9])):
        saved = opt.param_groups[1][key]
        opt.param_groups[1][key] = value
        with pytest.raises(TypeError, match=re.escape(
                f"param group 1's {key} must be a number, got {value!r}")):
            opt.step()
        opt.param_groups[1][key] = saved
    assert all(torch.equal(b, p) for b, (_, p) in zip(before, params))
    assert opt.step_count == 0
    with pytest.raises(TypeError, match=r"lr must be a number, got 'abc'"):
        muonrt.Muon(named((4, 4)), lr="abc")


def test_group_momentum_negative_is_rejected_by_the_library():
    params = named((4, 4))
    opt = muonrt.Muon(params)
    opt.param_groups[0]["momentum"] = -0.5
    params[0][1].grad = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"momentum should be >= 0 but is: "
                                         r"-0.5 \(parameter \"w0\"\)"):
        opt.step()


def test_integers_past_c_types_are_refused_not_wrapped():
    """ctypes wraps an int that does not fit its C type (2**32 + 2 would
    reach the library as 2): every size the package hands over is checked
    first, naming it."""
    big = 2**32 + 2
    with pytest.raises(ValueError, match=rf"Mesh dimension 'dp''s size is "
                                         rf"{big}, outside a C int32's"):
        muonrt.Mesh(["dp"], [big])
    with pytest.raises(ValueError, match=rf"ns_steps is {big + 3}"):
        muonrt.Muon(named((4, 4)), ns_steps=big + 3)
    with pytest.raises(ValueError, match=r"bucket_size_bytes is 2\*\*70|"
                                         rf"bucket_size_bytes is {2**70}"):
        muonrt.Muon(named((4, 4)), bucket_size_bytes=2**70)
    w = torch.nn.Parameter(torch.randn(8, 4))
    with pytest.raises(ValueError, match=rf"qk_clip layer 0's num_heads is "
                                         rf"{big}"):
        muonrt.Muon([("w", w)], qk_clip={"layers": [
            {"q": "w", "k": "w", "num_heads": big, "head_dim": 1}]})


def test_integers_that_are_not_integers_are_refused_not_truncated():
    """int() would truncate 5.5 to 5 and parse "5": a TypeError naming the
    option instead (an integral float such as 4.0 is taken)."""
    with pytest.raises(TypeError, match=r"ns_steps must be an integer, got "
                                        r"5.5"):
        muonrt.Muon(named((4, 4)), ns_steps=5.5)
    with pytest.raises(TypeError, match=r"prefetch_count must be an integer"):
        muonrt.Muon(named((4, 4)), prefetch_count="1")
    muonrt.Muon(named((4, 4)), ns_steps=4.0)
    # Integers of torch and integer-valued reals are integers.
    muonrt.Muon(named((4, 4)), ns_steps=torch.tensor(4))
    with pytest.raises(TypeError, match=r"ns_steps must be an integer"):
        muonrt.Muon(named((4, 4)), ns_steps=torch.tensor(4.5))


def test_param_groups_changed_after_construction_are_refused():
    """torch would step a parameter appended to a group's "params"; the
    runtime plans over its parameters once, so step() refuses a changed
    group instead of ignoring it (or stepping a removed one)."""
    params = named((4, 4), (6, 4))
    opt = muonrt.Muon(params)
    for _, p in params:
        p.grad = torch.ones_like(p)
    extra = torch.nn.Parameter(torch.randn(4, 4))
    opt.param_groups[0]["params"].append(extra)
    with pytest.raises(RuntimeError, match=r"param group 0 holds 3 "
                                           r"parameters or others than the 2"):
        opt.step()
    opt.param_groups[0]["params"].pop()
    opt.step()
    assert opt.step_count == 1
    opt.param_groups.append({"params": [extra], "lr": 0.1})
    with pytest.raises(RuntimeError, match=r"2 param groups, it was created "
                                           r"with 1"):
        opt.step()


def test_add_param_group_after_construction_is_not_implemented():
    opt = muonrt.Muon(named((4, 4)))
    with pytest.raises(NotImplementedError, match="fixed at construction"):
        opt.add_param_group({"params": [("x", torch.randn(2, 2))]})


def test_names_all_or_nothing_and_unique():
    a = torch.nn.Parameter(torch.randn(3, 3))
    b = torch.nn.Parameter(torch.randn(3, 3))
    with pytest.raises(ValueError, match="Some param names are missing"):
        muonrt.Muon([{"params": [("a", a)]}, {"params": [b]}])
    with pytest.raises(ValueError, match="'a' appears twice"):
        muonrt.Muon([("a", a), ("a", b)])
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        muonrt.Muon([{"params": [("a", a)]}, {"params": [("b", a)]}])
    with pytest.raises(ValueError, match="2 params but 1 names"):
        muonrt.Muon([{"params": [a, b], "param_names": ["a"]}])


def test_sets_are_rejected_like_torch():
    with pytest.raises(TypeError, match="ordered collections"):
        muonrt.Muon([{"params": {torch.nn.Parameter(torch.randn(2, 2))}}])


def test_layout_errors():
    params = named((4, 4), (4, 4))
    mesh = muonrt.Mesh(["dp_shard"], [2])
    with pytest.raises(ValueError, match="no process group"):
        muonrt.Muon(params, mesh=mesh)
    with pytest.raises(ValueError, match="placements has no entry for parameter 'w1'"):
        muonrt.Muon(params, placements={"w0": ["Replicate()"]})
    with pytest.raises(ValueError, match=r"names unknown parameters \['typo'\]"):
        muonrt.Muon(params, placements={"w0": ["Replicate()"], "w1": ["Replicate()"],
                                        "typo": ["Shard(0)"]})
    with pytest.raises(ValueError, match=r"parameter 'w0': .*Partial\(\) is not supported"):
        muonrt.Muon(params, placements=["Partial()"])
    with pytest.raises(ValueError, match=r"'w0' has 2 placements"):
        muonrt.Muon(params, placements=["Replicate()", "Replicate()"])


def test_closed_optimizer_raises():
    params = named((4, 4))
    opt = muonrt.Muon(params)
    opt.close()
    opt.close()
    params[0][1].grad = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="closed"):
        opt.step()
