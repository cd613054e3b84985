//===- fork_server.cpp - memslim-opt --fork-server ------------------------===//
//
// What: a server that starts once and runs each request in a forked child,
// which is a fresh memslim-opt running tool_main on the request's arguments.
// Why: a process start costs ~0.4 s here (torch's static initialisers), more
// than most runs of the fuzzers (bench/, test/fuzz/runner.py: MemslimOpt).
//
//===----------------------------------------------------------------------===//
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "memslim_opt.h"
#include "support.h"

namespace memslim_opt {

// `memslim-opt --fork-server` (for the fuzzers, bench/ and test/fuzz/): a process
// start costs ~0.4 s here (torch's static initialisers), more than most runs. The
// server starts once and forks one child per request; the child is a fresh
// memslim-opt (the same static state, no threads started, nothing parsed) that
// runs tool_main on the request's arguments. A request is one line on stdin:
// fields separated by \x1f: stdout file, stderr file, time limit in seconds (0:
// none; SIGALRM past it), then the arguments. The reply is one line on stdout:
// the child's raw wait status (see waitpid). EOF on stdin ends the server.
int fork_server() {
  std::string pending;
  char buf[65536];
  for (;;) {
    size_t nl;
    while ((nl = pending.find('\n')) == std::string::npos) {
      const ssize_t k = ::read(0, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return 0;
      pending.append(buf, static_cast<size_t>(k));
    }
    const std::string line = pending.substr(0, nl);
    pending.erase(0, nl + 1);
    std::vector<std::string> f;
    size_t at = 0;
    for (size_t sep; (sep = line.find('\x1f', at)) != std::string::npos; at = sep + 1)
      f.push_back(line.substr(at, sep - at));
    f.push_back(line.substr(at));
    long limit = -1;
    if (f.size() >= 3) {
      char* end = nullptr;
      limit = std::strtol(f[2].c_str(), &end, 10);
      if (end == f[2].c_str() || *end != '\0') limit = -1;
    }
    if (limit < 0) {
      std::printf("bad request\n");
      std::fflush(stdout);
      continue;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int in = ::open("/dev/null", O_RDONLY);
      const int out = ::open(f[0].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(f[1].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || err < 0) _exit(125);
      dup2(in, 0);
      dup2(out, 1);
      dup2(err, 2);
      close(in);
      close(out);
      close(err);
      if (limit > 0) alarm(static_cast<unsigned>(limit));
      std::vector<std::string> args = {"memslim-opt"};
      args.insert(args.end(), f.begin() + 3, f.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      g_quick_exit = true;
      exit_now(tool_main(static_cast<int>(args.size()), argv.data()));
    }
    int status = 0;
    if (pid < 0) {
      status = 126 << 8; // as a child that exited 126
    } else {
      while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) break;
    }
    std::printf("%d\n", status);
    std::fflush(stdout);
  }
}

} // namespace memslim_opt
