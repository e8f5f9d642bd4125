# Per-thread CPU intervals from perf sched_switch events (README section 1): switch.txt and
# tids.txt from `perf script` as the README says; prints the busy windows of each process.
import re,collections,sys
pid_of={}
for l in open('tids.txt'):
    m=re.search(r'(\d+)/(\d+)',l)
    if m and m.group(2)!='-1': pid_of[int(m.group(2))]=int(m.group(1))
pat=re.compile(r'\[(\d+)\]\s+([\d.]+):.*prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=.* next_pid=(\d+)')
cur={0:None,1:None}; start={}
iv=[]  # (tid, t0, t1, cpu)
for l in open('switch.txt'):
    m=pat.search(l)
    if not m: continue
    cpu=int(m.group(1)); t=float(m.group(2)); prev=int(m.group(3)); nxt=int(m.group(5))
    if cpu in start and start[cpu][0]==prev:
        iv.append((prev,start[cpu][1],t,cpu))
    start[cpu]=(nxt,t)
SB,SV=22811,22815
# bin per 0.1s: cpu time per process
import math
t0=min(i[1] for i in iv); t1=max(i[2] for i in iv)
nb=int((t1-t0)/0.1)+1
busy={SB:[0]*nb,SV:[0]*nb}
for tid,a,b,c in iv:
    p=pid_of.get(tid)
    if p not in busy: continue
    x=a
    while x<b:
        k=int((x-t0)/0.1); e=min(b,t0+(k+1)*0.1)
        if e<=x: e=min(b,x+1e-9)
        busy[p][min(k,nb-1)]+=e-x; x=e
# windows: consecutive bins where a process uses >1.0 core (>0.1s of 0.1s bin... use >0.05)
def windows(p):
    w=[];s=None
    for k,v in enumerate(busy[p]):
        on=v>0.12
        if on and s is None: s=k
        if not on and s is not None:
            if k-s>=20: w.append((s,k))
            s=None
    return w
for p,name in ((SV,'server'),(SB,'bench')):
    for s,e in windows(p):
        a=t0+s*0.1;b=t0+e*0.1
        per=collections.Counter(); other=0; idle=0
        for tid,x,y,c in iv:
            o=max(0,min(y,b)-max(x,a))
            if o<=0: continue
            if tid==0: idle+=o
            elif pid_of.get(tid)==p: per[tid]+=o
            else: per[('other',pid_of.get(tid,tid))]+=o
        tot=sum(v for k,v in per.items() if not isinstance(k,tuple))
        top=', '.join('%s:%.2f'%(k,v) for k,v in per.most_common(6))
        print('%s %.1f-%.1f dur %.2f  proc cpu %.2f idle %.2f | %s'%(name,a-t0,b-t0,b-a,tot,idle,top))
