"""Runs one upstream test module; writes <out>.json: {case: [result, traceback]}."""
import json, sys, unittest
mod, out = sys.argv[1], sys.argv[2]
suite = unittest.defaultTestLoader.loadTestsFromName(mod)
res = {}
class R(unittest.TextTestResult):
    def addSuccess(self, t):
        super().addSuccess(t); res[t._testMethodName] = ["pass", ""]
    def addFailure(self, t, e):
        super().addFailure(t, e); res[t._testMethodName] = ["FAIL", self._exc_info_to_string(e, t)]
    def addError(self, t, e):
        super().addError(t, e); res[getattr(t, "_testMethodName", str(t))] = ["ERROR", self._exc_info_to_string(e, t)]
    def addSkip(self, t, r):
        super().addSkip(t, r); res[t._testMethodName] = ["skip", r]
unittest.TextTestRunner(verbosity=2, resultclass=R).run(suite)
json.dump(res, open(out, "w"), indent=1)
