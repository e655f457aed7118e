from planner.graph import INPUT_NODE, build_graph, crossing_tensors, cut_bytes, cut_grad_bytes, stage_sum
from profiles.format import TensorFlow
from synthetic import make_profile


def _skip_profile():
    """Five units with two skips (0 -> 4, 1 -> 3) and a bool mask read by units 1..3."""
    tensors = [
        TensorFlow(-1, (0,), (100,), "int64", False, "ids"),
        TensorFlow(-1, (1, 2, 3), (10,), "bool", False, "mask"),
        TensorFlow(0, (1,), (200,)),
        TensorFlow(0, (4,), (50,)),
        TensorFlow(1, (2,), (300,)),
        TensorFlow(1, (3,), (40,)),
        TensorFlow(2, (3,), (300,)),
        TensorFlow(3, (4,), (200,)),
    ]
    return make_profile([1.0] * 5, tensors=tensors)


def test_graph_has_units_input_and_tensor_edges():
    graph = build_graph(_skip_profile())
    assert sorted(graph.nodes) == [INPUT_NODE, 0, 1, 2, 3, 4]
    assert graph.edges[0, 4]["tensors"] == [3]
    assert graph.edges[INPUT_NODE, 2]["tensors"] == [1]
    assert graph.nodes[2]["name"] == "layers.2"


def test_skip_tensor_counts_once_per_cut_it_crosses():
    profile = _skip_profile()
    assert cut_bytes(profile, 0) == [260, 400, 400, 250]
    # The bool mask sends no gradient back.
    assert cut_grad_bytes(profile, 0) == [250, 390, 390, 250]


def test_mask_read_by_three_units_is_one_tensor():
    graph = build_graph(_skip_profile())
    assert crossing_tensors(graph, 1) == [1, 3, 4, 5]


def test_chain_cut_bytes_scale_with_micro_batch():
    profile = make_profile([1.0, 1.0, 1.0], sizes=(1, 4), activation_bytes=512)
    assert cut_bytes(profile, 0) == [512, 512]
    assert cut_bytes(profile, 1) == [2048, 2048]


def test_stage_sum_is_inclusive():
    assert stage_sum([1.0, 2.0, 4.0, 8.0], 1, 2) == 6.0


def test_cut_sums_equal_the_crossing_tensors_of_each_cut():
    """cut_bytes sums spans in one pass; on random skips it is exactly the per-cut definition."""
    import random

    for seed in range(20):
        rng = random.Random(seed)
        n = rng.randint(2, 30)
        tensors = []
        for _ in range(rng.randint(1, 3 * n)):
            producer = rng.randint(-1, n - 2)
            consumers = tuple(sorted(rng.sample(range(producer + 1, n), rng.randint(1, min(3, n - 1 - producer)))))
            tensors.append(TensorFlow(producer, consumers, (rng.randint(0, 999),), "float32", rng.random() < 0.7))
        profile = make_profile([1.0] * n, tensors=tensors)
        graph = build_graph(profile)
        for grad_only, got in ((False, cut_bytes(profile, 0)), (True, cut_grad_bytes(profile, 0))):
            expected = [
                sum(
                    profile.tensors[t].bytes[0]
                    for t in crossing_tensors(graph, cut)
                    if profile.tensors[t].needs_grad or not grad_only
                )
                for cut in range(n - 1)
            ]
            assert got == expected
