// Parses Prometheus text exposition line by line, the way a scraper does, and
// records the structural mistakes a real scraper would reject.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace jobguard::test {

struct Exposition {
  std::map<std::string, std::string> type;  // family -> counter|gauge|histogram...
  std::set<std::string> help;               // families with a HELP line
  std::map<std::string, double> samples;    // "name{labels}" -> value
  std::vector<std::string> problems;        // empty when the text is well-formed
};

inline Exposition parse_exposition(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  std::set<std::string> finished;  // families whose sample block has ended
  std::string current;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + ": ";
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0) {
      const auto name = line.substr(7, line.find(' ', 7) - 7);
      if (!e.help.insert(name).second) e.problems.push_back(where + "second HELP for " + name);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const auto sp = line.find(' ', 7);
      const auto name = line.substr(7, sp - 7);
      if (e.type.count(name)) e.problems.push_back(where + "second TYPE for " + name);
      e.type[name] = line.substr(sp + 1);
      continue;
    }
    if (line[0] == '#') continue;
    // name{labels} value  — label values may contain escaped quotes and spaces.
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name = line.substr(0, i);
    std::size_t key_end = i;
    if (i < line.size() && line[i] == '{') {
      bool in_quotes = false;
      for (++i; i < line.size(); ++i) {
        if (in_quotes && line[i] == '\\') { ++i; continue; }
        if (line[i] == '"') in_quotes = !in_quotes;
        else if (!in_quotes && line[i] == '}') break;
      }
      if (i >= line.size()) { e.problems.push_back(where + "unterminated labels"); continue; }
      key_end = ++i;
    }
    if (i >= line.size() || line[i] != ' ') { e.problems.push_back(where + "no value"); continue; }
    const std::string value = line.substr(i + 1);
    double v = 0;
    if (value == "+Inf") v = 1.0 / 0.0;
    else if (value == "-Inf") v = -1.0 / 0.0;
    else {
      std::size_t used = 0;
      try { v = std::stod(value, &used); } catch (...) { used = 0; }
      if (used != value.size()) { e.problems.push_back(where + "bad value \"" + value + "\""); continue; }
    }
    // The family a sample belongs to: histogram samples carry suffixes.
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        const std::string base = name.substr(0, name.size() - s.size());
        if (e.type.count(base) && e.type[base] == "histogram") family = base;
      }
    }
    if (!e.type.count(family)) e.problems.push_back(where + "sample " + name + " without TYPE");
    if (!e.help.count(family)) e.problems.push_back(where + "sample " + name + " without HELP");
    if (family != current) {
      if (finished.count(family)) e.problems.push_back(where + "samples of " + family + " not contiguous");
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    e.samples[line.substr(0, key_end)] = v;
  }
  if (!text.empty() && text.back() != '\n') e.problems.push_back("text does not end with a newline");
  return e;
}

}  // namespace jobguard::test
