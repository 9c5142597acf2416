#!/usr/bin/env python3
"""Line counts and longest functions of a Rust tree (brace matching, strings/comments skipped)."""
import os, re, sys
root = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
fnre = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')
def strip(line, state):
    out=[]; i=0; n=len(line)
    while i<n:
        if state['block']:
            j=line.find('*/',i)
            if j<0: return ''.join(out)
            state['block']=False; i=j+2; continue
        c=line[i]
        if state['str']:
            if c=='\\': i+=2; continue
            if c=='"': state['str']=False
            i+=1; continue
        if line.startswith('//',i): break
        if line.startswith('/*',i): state['block']=True; i+=2; continue
        if c=='"': state['str']=True; i+=1; continue
        if c=="'" and i+2<n and (line[i+2]=="'" or (line[i+1]=='\\')):
            j=line.find("'",i+2 if line[i+1]!='\\' else i+3); i=(j+1) if j>0 else n; continue
        out.append(c); i+=1
    return ''.join(out)
total=0; fns=[]; files=0
for d,_,fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p=os.path.join(d,f); lines=open(p).read().split('\n'); total+=len(lines)-1; files+=1
        state={'block':False,'str':False}; clean=[strip(l,state) for l in lines]
        for i,l in enumerate(lines):
            m=fnre.match(l)
            if not m: continue
            depth=0; started=False
            for j in range(i,len(clean)):
                s=clean[j]
                if not started and ';' in s and '{' not in s: break
                for ch in s:
                    if ch=='{': depth+=1; started=True
                    elif ch=='}': depth-=1
                if started and depth==0:
                    fns.append((j-i+1, os.path.relpath(p,root), i+1, m.group(6))); break
fns.sort(reverse=True)
print(f"{files} files, {total} lines, {len(fns)} functions")
for n,p,l,name in fns[:top]: print(f"{n:5} {p}:{l} {name}")
