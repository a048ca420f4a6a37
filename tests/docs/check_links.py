#!/usr/bin/env python3
"""Checks the README and the pages under docs/.

    python3 tests/docs/check_links.py ROOT

- every relative link in README.md and docs/**/*.md names a file or folder that exists, and
  every #anchor names a heading of its target (GitHub's slugs: lower case, punctuation but
  '-' and '_' dropped, spaces to '-', -1, -2, ... for repeated headings);
- README.md is under 200 lines;
- README.md starts with `# muster` and its first fenced block holds `./deploy/demo.sh` and
  `./deploy/test.sh` (CI and a test read them).

Prints one line per problem and exits 1 if there is any. Python 3 standard library only.
"""
import os
import re
import sys
import urllib.parse

FENCE = re.compile(r'^\s*(`{3,}|~{3,})')
HEADING = re.compile(r'^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$')
LINK = re.compile(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
REF_DEF = re.compile(r'^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$')
CODE_SPAN = re.compile(r'(`+)(.+?)\1')


def prose_lines(text):
    """(line number, line, in_fence) for each line; fenced code is marked."""
    fence = None
    for number, line in enumerate(text.split('\n'), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                yield number, line, True
                continue
            yield number, line, False
        else:
            closing = line.strip()
            if match and closing[0] == fence[0] and len(closing) >= len(fence) \
                    and closing.strip(fence[0]) == '':
                fence = None
            yield number, line, True


def heading_text(raw):
    text = re.sub(r'[ \t]+#+[ \t]*$', '', raw or '')
    text = re.sub(r'^#+$', '', text)
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), text)
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)   # links and images: their text
    text = re.sub(r'<[^>]+>', '', text)                          # inline HTML
    return text.strip()


def slug(text):
    text = text.lower()
    text = ''.join(ch for ch in text if ch.isalnum() or ch in '-_ ')
    return text.replace(' ', '-')


def anchors(text):
    seen = {}
    result = set()
    for _, line, in_fence in prose_lines(text):
        if in_fence:
            continue
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(heading_text(match.group(2)))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f'{base}-{count}')
    return result


def links(text):
    for number, line, in_fence in prose_lines(text):
        if in_fence:
            continue
        plain = CODE_SPAN.sub(lambda m: ' ' * len(m.group(0)), line)
        for match in LINK.finditer(plain):
            yield number, match.group(1)
        match = REF_DEF.match(plain)
        if match:
            yield number, match.group(1)


def markdown_files(root):
    files = [os.path.join(root, 'README.md')]
    docs = os.path.join(root, 'docs')
    for folder, dirs, names in os.walk(docs):
        dirs.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith('.md')]
    return files


def main():
    if len(sys.argv) != 2:
        print('usage: check_links.py ROOT', file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    problems = []
    cache = {}

    def read(path):
        if path not in cache:
            with open(path, encoding='utf-8') as f:
                cache[path] = f.read()
        return cache[path]

    readme = os.path.join(root, 'README.md')
    if not os.path.isfile(readme):
        print(f'{readme}: missing')
        return 1

    for path in markdown_files(root):
        rel = os.path.relpath(path, root)
        text = read(path)
        for number, target in links(text):
            if re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*:', target) or target.startswith('//'):
                continue                                   # http:, mailto:, ...: not checked
            file_part, _, anchor = target.partition('#')
            file_part = urllib.parse.unquote(file_part)
            if file_part:
                if file_part.startswith('/'):
                    resolved = os.path.normpath(os.path.join(root, file_part.lstrip('/')))
                else:
                    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(resolved):
                    problems.append(f'{rel}:{number}: link to {target}: '
                                    f'{os.path.relpath(resolved, root)} does not exist')
                    continue
            else:
                resolved = path
            if anchor:
                if not resolved.endswith('.md') or os.path.isdir(resolved):
                    problems.append(f'{rel}:{number}: link to {target}: an anchor into a file '
                                    'that is not Markdown')
                    continue
                if urllib.parse.unquote(anchor).lower() not in anchors(read(resolved)):
                    problems.append(f'{rel}:{number}: link to {target}: no heading '
                                    f'#{anchor} in {os.path.relpath(resolved, root)}')

    lines = read(readme).split('\n')
    if lines and lines[-1] == '':
        lines = lines[:-1]
    if len(lines) >= 200:
        problems.append(f'README.md: {len(lines)} lines; it must stay under 200')
    if not lines or lines[0] != '# muster':
        problems.append('README.md:1: the first line must be "# muster"')
    first_block, in_block = [], False
    for _, line, in_fence in prose_lines(read(readme)):
        if in_fence and not in_block:
            in_block = True
            continue
        if in_block:
            if not in_fence or FENCE.match(line):
                break
            first_block.append(line)
    for command in ('./deploy/demo.sh', './deploy/test.sh'):
        if not any(command in line for line in first_block):
            problems.append(f'README.md: the first fenced block does not hold {command}')

    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
