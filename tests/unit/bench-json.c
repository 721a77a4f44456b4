/* SPDX-License-Identifier: Apache-2.0 */
/* What te_json_check() costs: a 1 MiB descriptor checked beside json-glib's
 * parse of it (best of several runs each), the time to refuse 1 MB of
 * nesting and a 1 MB array, and objects of keys chosen against the repeat
 * check. Not a test: docs/benchmarks.md records it. */
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <time.h>

#include "../common/hostile.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* The thread's CPU time: what a shared machine's waits do not inflate. */
static double cpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  size_t n=1<<20; char *s=malloc(n+64); size_t k=0;
  k+=sprintf(s+k,"{\"name\":\"10.0.0.1:15123\",\"protocol\":\"tcp\",\"buffers\":[");
  int i=0; while(k<n-200){k+=sprintf(s+k,"%s{\"name\":\"cpu:0\",\"addr\":%d,\"length\":65536,\"rkey\":[1,2],\"lkey\":[1,2]}",i?",":"",4096*(i+1));i++;}
  k+=sprintf(s+k,"],\"devices\":[\"a\",\"b\"]}"); 
  te_json_limits lim=TE_JSON_LIMITS_DEFAULT; char why[128];
  double best=1e9; for(int r=0;r<7;r++){double t=now(); int rc=te_json_check(s,k,&lim,why,sizeof why); t=now()-t; if(rc){printf("rc %d %s\n",rc,why);return 1;} if(t<best)best=t;}
  double bp=1e9; for(int r=0;r<5;r++){double t=now(); JsonParser*p=json_parser_new_immutable(); json_parser_load_from_data(p,s,k,NULL); g_object_unref(p); t=now()-t; if(t<bp)bp=t;}
  printf("descriptor %zu bytes, %d buffers: check %.3f ms (%.2f GB/s), json-glib parse %.3f ms, ratio %.3f\n",k,i,best*1e3,k/best/1e9,bp*1e3,best/bp);
  size_t d=500000; char *q=malloc(2*d+2); memset(q,'[',d); q[d]='1'; memset(q+d+1,']',d); 
  best=1e9; for(int r=0;r<7;r++){double t=now(); te_json_check(q,2*d+1,&lim,why,sizeof why); t=now()-t; if(t<best)best=t;}
  printf("refusing 1 MB of nesting: %.3f ms (%s)\n",best*1e3,why);
  char *a=malloc(2*n); k=0; a[k++]='['; while(k<n-2){a[k++]='0';a[k++]=',';} a[k-1]=']'; 
  best=1e9; for(int r=0;r<7;r++){double t=now(); te_json_check(a,k,&lim,why,sizeof why); t=now()-t; if(t<best)best=t;}
  printf("refusing a 1 MB array: %.3f ms (%s)\n",best*1e3,why);
  size_t hk; char *h=hostile_keys(65536,&hk);
  double bc=1e9; best=1e9; for(int r=0;r<7;r++){double t=now(),c=cpu(); int rc=te_json_check(h,hk,&lim,why,sizeof why); c=cpu()-c; t=now()-t; if(rc){printf("rc %d %s\n",rc,why);return 1;} if(t<best)best=t; if(c<bc)bc=c;}
  printf("65,536 keys, 16,384 of them sharing one FNV-1a hash, %zu bytes: %.3f ms (%.3f ms of CPU)\n",hk,best*1e3,bc*1e3);
  /* 4,095 keys of 4,000 bytes, equal but for their last 5: every comparison reads a whole key */
  size_t lk=4095,kl=4000; char *l=malloc(lk*(kl+8)+2); k=0; l[k++]='{';
  for(size_t j=0;j<lk;j++){ if(j) l[k++]=','; l[k++]='"'; memset(l+k,'k',kl-5); k+=kl-5; k+=sprintf(l+k,"%05zu\":0",(j*7919)%lk); }
  l[k++]='}';
  bc=1e9; best=1e9; for(int r=0;r<7;r++){double t=now(),c=cpu(); int rc=te_json_check(l,k,&lim,why,sizeof why); c=cpu()-c; t=now()-t; if(rc){printf("rc %d %s\n",rc,why);return 1;} if(t<best)best=t; if(c<bc)bc=c;}
  printf("4,095 keys of 4,000 bytes equal but for the last 5, %zu bytes: %.3f ms (%.3f ms of CPU)\n",k,best*1e3,bc*1e3);
}
