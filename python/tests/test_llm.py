"""deepinfer_c on the tiny checkpoints: vLLM-shaped generate / chat, seeded reproducibility, batch
invariance, n > 1, stop ids, logprobs, a regex constraint, and errors. Run from the repository root:

    python3 -m unittest discover -s python/tests -t python

The golden tiny checkpoint (tests/data/v41-tiny-nosel) has no tokenizer, so it takes prompt ids;
text and chat tests write a tiny model with the V4 tokenizer (`deepinfer mkmodel --preset tiny`)
and are skipped when data/tokenizer is not installed. Generations are a few tokens each: the
engine's current CPU runner recomputes the whole history per token."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from deepinfer_c import LLM, DeepInferError, SamplingParams  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "data", "v41-tiny-nosel")
TOKENIZER = os.path.join(ROOT, "data", "tokenizer", "deepseek-v4")
CLI = os.environ.get("DI_CLI", os.path.join(ROOT, "build", "deepinfer"))

PROMPT_A = [0, 17, 99, 424, 313, 7, 123]
PROMPT_B = [0, 5, 6, 7]


class TestTokenPrompts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llm = LLM(GOLDEN, max_num_seqs=8, max_model_len=128, seed=7, num_threads=1)

    @classmethod
    def tearDownClass(cls):
        cls.llm.close()

    def test_seeded_reproducible_and_batch_invariant(self):
        sp = SamplingParams(temperature=0.9, seed=42, max_tokens=5)
        alone = self.llm.generate([PROMPT_A], sp)[0].outputs[0]
        again = self.llm.generate({"prompt_token_ids": PROMPT_A}, sp)[0].outputs[0]
        self.assertEqual(len(alone.token_ids), 5)
        self.assertEqual(alone.finish_reason, "length")
        self.assertEqual(alone.token_ids, again.token_ids)
        batch = self.llm.generate([PROMPT_B, PROMPT_A], [SamplingParams(temperature=0.5, seed=1, max_tokens=3), sp])
        self.assertEqual([o.request_id != "" for o in batch], [True, True])
        self.assertEqual(len(batch[0].outputs[0].token_ids), 3)
        self.assertEqual(batch[1].outputs[0].token_ids, alone.token_ids)
        self.assertEqual(batch[1].prompt_token_ids, PROMPT_A)
        other = self.llm.generate([PROMPT_A], SamplingParams(temperature=0.9, seed=43, max_tokens=5))[0]
        self.assertNotEqual(other.outputs[0].token_ids, alone.token_ids)

    def test_n_choices_logprobs_and_stop_ids(self):
        sp = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=3, logprobs=2)
        out = self.llm.generate([PROMPT_B], sp)[0]
        self.assertEqual([c.index for c in out.outputs], [0, 1])
        one = self.llm.generate([PROMPT_B], SamplingParams(temperature=1.0, seed=3, max_tokens=3))[0].outputs[0]
        self.assertEqual(out.outputs[0].token_ids, one.token_ids)  # choice 0 of n=2 == the n=1 request
        self.assertNotEqual(out.outputs[0].token_ids, out.outputs[1].token_ids)
        for c in out.outputs:
            self.assertEqual(len(c.logprobs), 3)
            for tok, entry in zip(c.token_ids, c.logprobs):
                self.assertIn(tok, entry)
                self.assertLessEqual(entry[tok], 0.0)
                self.assertGreaterEqual(len(entry), 2)
            self.assertAlmostEqual(c.cumulative_logprob, sum(e[t] for e, t in zip(c.logprobs, c.token_ids)))
        # greedy, then stop on the second greedy token: the output ends there, id included
        g = self.llm.generate([PROMPT_A], SamplingParams(temperature=0, max_tokens=4))[0].outputs[0]
        s = self.llm.generate([PROMPT_A], SamplingParams(temperature=0, max_tokens=4,
                                                         stop_token_ids=[g.token_ids[1]]))[0].outputs[0]
        self.assertEqual(s.token_ids, g.token_ids[:2])
        self.assertEqual(s.finish_reason, "stop")

    def test_recompute_runner_agrees(self):
        sp = SamplingParams(temperature=0.7, seed=9, max_tokens=4)
        exact = LLM(GOLDEN, max_model_len=64, num_threads=1, runner="recompute")
        try:
            want = exact.generate([PROMPT_A], sp)[0].outputs[0].token_ids
        finally:
            exact.close()
        self.assertEqual(self.llm.generate([PROMPT_A], sp)[0].outputs[0].token_ids, want)

    def test_errors(self):
        with self.assertRaises(DeepInferError) as cm:
            self.llm.generate([[0, self.llm.vocab_size]], SamplingParams(max_tokens=2))
        self.assertIn("prompt token 1", str(cm.exception))
        with self.assertRaises(DeepInferError):
            self.llm.generate(["text needs a tokenizer"], SamplingParams(max_tokens=2))
        with self.assertRaises(DeepInferError):
            LLM("/nonexistent-checkpoint")
        # the engine is still usable after a rejected request
        self.assertEqual(len(self.llm.generate([PROMPT_B], SamplingParams(max_tokens=1))[0].outputs[0].token_ids), 1)


@unittest.skipUnless(os.path.exists(os.path.join(TOKENIZER, "tokenizer.json")), "data/tokenizer not installed")
class TestTextAndChat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="deepinfer_c_test_")
        model = os.path.join(cls.dir, "tiny")
        subprocess.run([CLI, "mkmodel", "--preset", "tiny", "--out", model, "--tokenizer", TOKENIZER], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        cls.llm = LLM(model, max_num_seqs=4, max_model_len=128, num_threads=1)

    @classmethod
    def tearDownClass(cls):
        cls.llm.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_generate_text_and_regex(self):
        out = self.llm.generate("The sky is", SamplingParams(temperature=0, max_tokens=3))[0]
        self.assertEqual(out.prompt, "The sky is")
        self.assertEqual(len(out.outputs[0].token_ids), 3)
        self.assertIsInstance(out.outputs[0].text, str)
        r = self.llm.generate(["Answer:"], SamplingParams(seed=2, max_tokens=8, guided_regex="(yes|no)"))[0].outputs[0]
        self.assertIn(r.text, ("yes", "no"))
        self.assertEqual(r.finish_reason, "stop")
        self.assertEqual(r.token_ids[-1], self.llm.eos_token_id)

    def test_chat(self):
        msgs = [{"role": "user", "content": "Hi"}]
        a = self.llm.chat(msgs, SamplingParams(seed=1, max_tokens=3), chat_template_kwargs={"thinking": False})
        b = self.llm.chat([msgs], SamplingParams(seed=1, max_tokens=3), chat_template_kwargs={"thinking": False})
        self.assertEqual(len(a), 1)
        self.assertEqual(a[0].outputs[0].token_ids, b[0].outputs[0].token_ids)
        ids = self.llm.encode_chat({"messages": msgs, "thinking": {"type": "disabled"}})
        self.assertEqual(ids[0], 0)  # BOS
        self.assertGreater(len(ids), 3)


if __name__ == "__main__":
    unittest.main()
